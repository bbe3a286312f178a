//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package main

import (
	"os"
	"os/signal"
	"syscall"
	"unsafe"
)

// termSize returns the rows and columns of the terminal f is, read at each
// call (TIOCGWINSZ), so that a resized terminal is followed; 0, 0 when the
// size cannot be read.
func termSize(f *os.File) (rows, cols int) {
	var ws struct{ row, col, xpixel, ypixel uint16 }
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, 0
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCGWINSZ, uintptr(unsafe.Pointer(&ws)))
	}); err != nil || errno != 0 {
		return 0, 0
	}
	return int(ws.row), int(ws.col)
}

// notifyResize delivers SIGWINCH (the terminal was resized) on the channel
// it returns until stop is called.
func notifyResize() (<-chan os.Signal, func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	return ch, func() { signal.Stop(ch) }
}

//go:build linux

// Package ptytest opens pseudo-terminals for tests that must see what a
// program writes to a real terminal (colour, screen clearing) as opposed to
// a pipe. Linux only (/dev/ptmx); no dependency beyond the standard library.
package ptytest

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"
)

// Open returns a new pseudo-terminal: master is the side the test reads,
// tty is the terminal a program writes to (an *os.File that is a character
// device, as a shell's stdout is).
func Open() (master, tty *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	var unlock int32
	if err := ioctl(master, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	var n uint32
	if err := ioctl(master, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("pty number: %w", err)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, err
	}
	return master, tty, nil
}

func ioctl(f *os.File, req, arg uintptr) error {
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), req, arg)
	if errno != 0 {
		return errno
	}
	return nil
}

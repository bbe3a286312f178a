//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import "os"

// termSize cannot read a terminal's size here: the watch falls back to
// defaultRows x defaultCols.
func termSize(*os.File) (rows, cols int) { return 0, 0 }

// notifyResize has no resize signal here; each redraw uses the size it
// reads.
func notifyResize() (<-chan os.Signal, func()) { return nil, func() {} }

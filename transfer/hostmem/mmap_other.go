//go:build !linux

package hostmem

import (
	"errors"
	"os"
)

// sharedSupported: mapShared refuses shared memory before it opens a file.
const sharedSupported = false

const openNoFollow = 0

// mmapShared: the reference agent maps shared memory on Linux only.
func mmapShared(*os.File, int64, int) ([]byte, error) {
	return nil, errors.New("the reference agent maps shared memory on Linux only")
}

func munmap([]byte) error { return nil }

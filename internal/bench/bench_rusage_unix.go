//go:build unix

package bench

import (
	"syscall"
	"time"
)

// benchCPUSource names what benchProcessCPU measures.
const benchCPUSource = "getrusage(RUSAGE_SELF) user+system"

// benchProcessCPU returns the CPU time this process has used (every thread:
// user + system).
func benchProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

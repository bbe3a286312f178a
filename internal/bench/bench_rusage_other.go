//go:build !unix

package bench

import (
	"runtime/metrics"
	"time"
)

// benchCPUSource names what benchProcessCPU measures.
const benchCPUSource = "the Go runtime's CPU estimate (no getrusage on this platform)"

// benchProcessCPU estimates the CPU time this process has used from the Go
// runtime's CPU classes (total minus idle).
func benchProcessCPU() time.Duration {
	s := []metrics.Sample{{Name: "/cpu/classes/total:cpu-seconds"}, {Name: "/cpu/classes/idle:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 || s[1].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return time.Duration((s[0].Value.Float64() - s[1].Value.Float64()) * float64(time.Second))
}

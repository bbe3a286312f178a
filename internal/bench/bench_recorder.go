package bench

import (
	"context"
	"errors"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/client"
)

// benchRecorder collects one phase's rooms.
type benchRecorder struct {
	ok, failed, inflight atomic.Int64

	mu       sync.Mutex
	openDest []time.Duration
	destSucc []time.Duration
	life     []time.Duration
	// chunkTold are the last chunk -> engine told delays (bench_delays.go).
	chunkTold []time.Duration
	reasons   map[string]*benchFailure
}

// benchFailure counts one failure reason, with an example message.
type benchFailure struct {
	Count   int64  `json:"count"`
	Example string `json:"example"`
}

func (r *benchRecorder) done(openDest, destSucc, life time.Duration) {
	r.mu.Lock()
	if openDest >= 0 {
		r.openDest = append(r.openDest, openDest)
		r.destSucc = append(r.destSucc, destSucc)
	}
	r.life = append(r.life, life)
	r.mu.Unlock()
	r.ok.Add(1)
}

func (r *benchRecorder) fail(err error) {
	reason := benchReason(err)
	r.mu.Lock()
	f := r.reasons[reason]
	if f == nil {
		f = &benchFailure{Example: err.Error()}
		r.reasons[reason] = f
	}
	f.Count++
	r.mu.Unlock()
	r.failed.Add(1)
}

// benchReason classifies a room's failure.
func benchReason(err error) string {
	if errors.Is(err, errBenchUnreachable) {
		return "daemon unreachable"
	}
	var rf *client.RoomFailedError
	if errors.As(err, &rf) {
		return "room failed: " + rf.Code.String()
	}
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Op() + ": " + ce.Code().String()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "room timeout"
	}
	return "error"
}

// benchUsage is the process's resource use: CPU (getrusage) and heap
// allocations and GC CPU (runtime/metrics).
type benchUsage struct {
	cpu          time.Duration
	allocObjects uint64
	allocBytes   uint64
	gcCPU        float64 // runtime estimate, seconds
	goCPU        float64 // runtime estimate of all non-idle CPU, seconds
}

var benchMetricNames = []string{
	"/gc/heap/allocs:objects", "/gc/heap/tiny/allocs:objects", "/gc/heap/allocs:bytes",
	"/cpu/classes/gc/total:cpu-seconds", "/cpu/classes/total:cpu-seconds", "/cpu/classes/idle:cpu-seconds",
}

func benchReadUsage() benchUsage {
	s := make([]metrics.Sample, len(benchMetricNames))
	for i, n := range benchMetricNames {
		s[i].Name = n
	}
	metrics.Read(s)
	u64 := func(i int) uint64 {
		if s[i].Value.Kind() == metrics.KindUint64 {
			return s[i].Value.Uint64()
		}
		return 0
	}
	f64 := func(i int) float64 {
		if s[i].Value.Kind() == metrics.KindFloat64 {
			return s[i].Value.Float64()
		}
		return 0
	}
	return benchUsage{
		cpu:          benchProcessCPU(),
		allocObjects: u64(0) + u64(1),
		allocBytes:   u64(2),
		gcCPU:        f64(3),
		goCPU:        f64(4) - f64(5),
	}
}

func (u benchUsage) sub(o benchUsage) benchUsage {
	return benchUsage{
		cpu: u.cpu - o.cpu, allocObjects: u.allocObjects - o.allocObjects, allocBytes: u.allocBytes - o.allocBytes,
		gcCPU: u.gcCPU - o.gcCPU, goCPU: u.goCPU - o.goCPU,
	}
}

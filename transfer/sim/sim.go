package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// SimEngine is the simulated transfer engine, the embedded default: it
// computes a chunk's bytes from the KV layout, takes latency + bytes /
// bandwidth on the injected clock, writes the room marker into the metadata
// slot with the last chunk, and injects faults (a failure probability, as
// SGLANG_TEST_DISAGG_FAILURE_PROB does, and deterministic faults for tests).
type SimEngine struct {
	cfg   SimConfig
	clock kvlayout.Clock

	mu           sync.Mutex
	rng          *rand.Rand
	fault        func(transfer.ChunkOp) error
	scatterFault func(transfer.ScatterOp) error
}

// NewSimEngine builds a simulated engine on c (nil: kvlayout.RealClock).
func NewSimEngine(cfg SimConfig, c kvlayout.Clock) *SimEngine {
	if c == nil {
		c = kvlayout.RealClock{}
	}
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &SimEngine{cfg: cfg, clock: c, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// SetFault installs a deterministic fault: fn is called for every chunk
// before it moves; a non-nil error fails the chunk with that reason.
func (e *SimEngine) SetFault(fn func(transfer.ChunkOp) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fault = fn
}

// Transfer implements transfer.Engine.
func (e *SimEngine) Transfer(ctx context.Context, op transfer.ChunkOp) (transfer.ChunkResult, error) {
	e.mu.Lock()
	fault := e.fault
	fail := e.cfg.FailureProbability > 0 && e.rng.Float64() < e.cfg.FailureProbability
	e.mu.Unlock()
	bytes := transfer.ChunkBytes(op)
	d, err := e.move(ctx, bytes, func() error {
		if fault == nil {
			return nil
		}
		return fault(op)
	})
	if err != nil {
		return transfer.ChunkResult{}, err
	}
	if fail {
		return transfer.ChunkResult{Duration: d}, fmt.Errorf("%w: injected failure (transfer.sim.failure_probability = %g)", transfer.ErrTransferFailed, e.cfg.FailureProbability)
	}
	res := transfer.ChunkResult{Bytes: bytes, Duration: d}
	if op.Last && op.Marker != 0 {
		res.MarkerWritten = op.Marker
	}
	return res, nil
}

// TransferAsync implements transfer.AsyncEngine: without a fault to run (a
// hook or the failure probability) the chunk takes its time on a timer of
// the clock, not a goroutine; with one it runs as Transfer does, on its own
// goroutine (a fault hook may block).
func (e *SimEngine) TransferAsync(ctx context.Context, op transfer.ChunkOp, done func(transfer.ChunkResult, error)) {
	e.mu.Lock()
	synchronous := e.fault != nil || e.cfg.FailureProbability > 0
	e.mu.Unlock()
	if synchronous {
		go func() { done(e.Transfer(ctx, op)) }()
		return
	}
	bytes := transfer.ChunkBytes(op)
	d := e.duration(bytes)
	res := transfer.ChunkResult{Bytes: bytes, Duration: d}
	if op.Last && op.Marker != 0 {
		res.MarkerWritten = op.Marker
	}
	if d <= 0 {
		if err := ctx.Err(); err != nil {
			done(transfer.ChunkResult{}, err)
			return
		}
		done(res, nil)
		return
	}
	var once sync.Once
	var mu sync.Mutex
	var t kvlayout.Stopper
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		if t != nil {
			t.Stop()
		}
		mu.Unlock()
		once.Do(func() { done(transfer.ChunkResult{}, ctx.Err()) })
	})
	mu.Lock()
	t = e.clock.AfterFunc(d, func() {
		stop()
		once.Do(func() { done(res, nil) })
	})
	mu.Unlock()
}

// duration is the time a move of bytes takes: latency + bytes / bandwidth.
func (e *SimEngine) duration(bytes int64) time.Duration {
	d := e.cfg.Latency
	if e.cfg.BandwidthGBytesPerS > 0 {
		d += time.Duration(float64(bytes) / (e.cfg.BandwidthGBytesPerS * 1e9) * float64(time.Second))
	}
	return d
}

// move runs a deterministic fault, then takes latency + bytes / bandwidth on
// the clock (or until ctx is done).
func (e *SimEngine) move(ctx context.Context, bytes int64, fault func() error) (time.Duration, error) {
	if err := fault(); err != nil {
		return 0, fmt.Errorf("%w: %v", transfer.ErrTransferFailed, err)
	}
	d := e.duration(bytes)
	return d, kvlayout.Sleep(ctx, e.clock, d)
}

// SetScatterFault installs a deterministic fault for staged scatters: fn is
// called for every scatter before it moves; a non-nil error fails it.
func (e *SimEngine) SetScatterFault(fn func(transfer.ScatterOp) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.scatterFault = fn
}

// Scatter implements transfer.Scatterer: it takes latency + bytes /
// bandwidth for the region's bytes and writes the room marker when the op
// carries one.
func (e *SimEngine) Scatter(ctx context.Context, op transfer.ScatterOp) (transfer.ChunkResult, error) {
	e.mu.Lock()
	fault := e.scatterFault
	e.mu.Unlock()
	bytes := op.Bytes()
	d, err := e.move(ctx, bytes, func() error {
		if fault == nil {
			return nil
		}
		return fault(op)
	})
	if err != nil {
		return transfer.ChunkResult{}, err
	}
	return transfer.ChunkResult{Bytes: bytes, Duration: d, MarkerWritten: op.Marker}, nil
}

var (
	_ transfer.Engine      = (*SimEngine)(nil)
	_ transfer.AsyncEngine = (*SimEngine)(nil)
	_ transfer.Scatterer   = (*SimEngine)(nil)
)

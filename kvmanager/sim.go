package kvmanager

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/kvcopy"
	"github.com/decodeplane/decodeplane/prealloc"
)

// SimEngine is the simulated transfer engine, the embedded default: it
// computes a chunk's bytes from the KV layout, takes latency + bytes /
// bandwidth on the injected clock, writes the room marker into the metadata
// slot with the last chunk, and injects faults (a failure probability, as
// SGLANG_TEST_DISAGG_FAILURE_PROB does, and deterministic faults for tests).
type SimEngine struct {
	cfg   SimConfig
	clock Clock

	mu           sync.Mutex
	rng          *rand.Rand
	fault        func(ChunkOp) error
	scatterFault func(ScatterOp) error
}

// NewSimEngine builds a simulated engine.
func NewSimEngine(cfg SimConfig, clock Clock) *SimEngine {
	if clock == nil {
		clock = RealClock{}
	}
	seed := uint64(cfg.Seed)
	if seed == 0 {
		seed = rand.Uint64()
	}
	return &SimEngine{cfg: cfg, clock: clock, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// SetFault installs a deterministic fault: fn is called for every chunk
// before it moves; a non-nil error fails the chunk with that reason.
func (e *SimEngine) SetFault(fn func(ChunkOp) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fault = fn
}

// Transfer implements TransferEngine.
func (e *SimEngine) Transfer(ctx context.Context, op ChunkOp) (ChunkResult, error) {
	e.mu.Lock()
	fault := e.fault
	fail := e.cfg.FailureProbability > 0 && e.rng.Float64() < e.cfg.FailureProbability
	e.mu.Unlock()
	bytes := ChunkBytes(op)
	d, err := e.move(ctx, bytes, func() error {
		if fault == nil {
			return nil
		}
		return fault(op)
	})
	if err != nil {
		return ChunkResult{}, err
	}
	if fail {
		return ChunkResult{Duration: d}, fmt.Errorf("%w: injected failure (transfer.sim.failure_probability = %g)", ErrTransferFailed, e.cfg.FailureProbability)
	}
	res := ChunkResult{Bytes: bytes, Duration: d}
	if op.Last && op.Marker != 0 {
		res.MarkerWritten = op.Marker
	}
	return res, nil
}

// move runs a deterministic fault, then takes latency + bytes / bandwidth on
// the clock (or until ctx is done).
func (e *SimEngine) move(ctx context.Context, bytes int64, fault func() error) (time.Duration, error) {
	if err := fault(); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrTransferFailed, err)
	}
	d := e.cfg.Latency
	if e.cfg.BandwidthGBytesPerS > 0 {
		d += time.Duration(float64(bytes) / (e.cfg.BandwidthGBytesPerS * 1e9) * float64(time.Second))
	}
	return d, sleep(ctx, e.clock, d)
}

// SetScatterFault installs a deterministic fault for staged scatters: fn is
// called for every scatter before it moves; a non-nil error fails it.
func (e *SimEngine) SetScatterFault(fn func(ScatterOp) error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.scatterFault = fn
}

// Scatter implements Scatterer: it takes latency + bytes / bandwidth for the
// region's bytes and writes the room marker when the op carries one.
func (e *SimEngine) Scatter(ctx context.Context, op ScatterOp) (ChunkResult, error) {
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
		return ChunkResult{}, err
	}
	return ChunkResult{Bytes: bytes, Duration: d, MarkerWritten: op.Marker}, nil
}

// ChunkBytes is what a chunk moves over the wire from one prefill rank:
// tokens x the rank's per-token weight, plus on the last chunk the
// per-request state (RankWeights).
func ChunkBytes(op ChunkOp) int64 {
	perToken, state := RankWeights(op.Layout, op.Targets, op.PrefillPP, op.Rank.PP)
	total := int64(op.Tokens) * perToken
	if op.Last {
		total += state
	}
	return total
}

// RankWeights is what one prefill rank moves per token, and with its last
// chunk, into its decode targets: per non-dummy target, the heads it receives
// (MHA/GQA: 2 x heads x head_dim x dtype x layers; MLA: (latent + rope) x
// dtype x layers, plus the DSA indexer row) over the layers of the rank's PP
// stage (all of them when prefill PP is 1), and the Mamba state per target.
func RankWeights(l prealloc.Layout, targets []Target, prefillPP, ppRank int) (perToken, state int64) {
	layers := int64(l.NumLayers)
	if prefillPP > 1 {
		b, e := kvcopy.StageLayers(l.NumLayers, prefillPP, ppRank)
		layers = int64(e - b)
	}
	for _, t := range targets {
		if t.Dummy {
			continue
		}
		if l.IsMLA {
			perToken += (l.HeadBytes() + int64(l.DSAIndexBytes)) * layers
		} else {
			heads := t.NumHeads
			if heads == 0 {
				heads = l.HeadsPerRank
			}
			perToken += 2 * int64(heads) * l.HeadBytes() * layers
		}
		if l.Kind == prealloc.KindHybridLinear {
			state += l.MambaBytes
		}
	}
	return perToken, state
}

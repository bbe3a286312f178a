package kvmanager

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// layoutOf derives a validated decode layout.
func layoutOf(t *testing.T, f func(*prealloc.Config)) prealloc.Layout {
	t.Helper()
	c := prealloc.DefaultConfig()
	if f != nil {
		f(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return c.Layout()
}

func TestChunkBytes(t *testing.T) {
	gqa := layoutOf(t, nil) // 32 layers, 8 KV heads × 128, bf16, TP 1
	gqaTP4 := layoutOf(t, func(c *prealloc.Config) { c.Parallel.AttnTP = 4 })
	mla := layoutOf(t, mlaDecode(prealloc.KindMLA))
	hybridMLA := layoutOf(t, mlaDecode(prealloc.KindHybridMLA))
	hybridLinear := layoutOf(t, func(c *prealloc.Config) {
		c.Pool.Kind = prealloc.KindHybridLinear
		c.Pool.Mamba = prealloc.MambaConfig{StateSlots: 1024, StateBytes: 3 << 20}
	})
	tests := []struct {
		name string
		op   ChunkOp
		want int64
	}{
		{
			// 64 tokens × 2 (K, V) × 8 heads × 128 × 2 B × 32 layers.
			name: "MHA/GQA full heads", op: ChunkOp{Layout: gqa, Tokens: 64, Targets: []Target{{NumHeads: 8}}},
			want: 64 * 2 * 8 * 128 * 2 * 32,
		},
		{
			// Targets without a head count default to heads_per_rank (2 at TP 4).
			name: "GQA heads per rank", op: ChunkOp{Layout: gqaTP4, Tokens: 64, Targets: []Target{{}}},
			want: 64 * 2 * 2 * 128 * 2 * 32,
		},
		{
			// Prefill TP 1 → decode TP 4: four targets of 2 heads each.
			name: "GQA one prefill rank to four decode ranks", op: ChunkOp{Layout: gqaTP4, Tokens: 10, Targets: []Target{{NumHeads: 2}, {NumHeads: 2}, {NumHeads: 2}, {NumHeads: 2}}},
			want: 4 * 10 * 2 * 2 * 128 * 2 * 32,
		},
		{
			// A head slice of prefill TP 2 → decode TP 1: 4 of 8 heads.
			name: "GQA head slice", op: ChunkOp{Layout: gqa, Tokens: 100, Targets: []Target{{NumHeads: 4, DstHeadStart: 4}}},
			want: 100 * 2 * 4 * 128 * 2 * 32,
		},
		{name: "dummy target moves nothing", op: ChunkOp{Layout: gqa, Tokens: 64, Targets: []Target{{Dummy: true}}}, want: 0},
		{name: "no targets", op: ChunkOp{Layout: gqa, Tokens: 64}, want: 0},
		{
			// 64 tokens × (512 + 64) × 2 B × 32 layers; heads do not apply.
			name: "MLA", op: ChunkOp{Layout: mla, Tokens: 64, Targets: []Target{{NumHeads: 99}}},
			want: 64 * 576 * 2 * 32,
		},
		{
			// MLA plus 132 B of DSA indexer-K per token and layer.
			name: "hybrid MLA", op: ChunkOp{Layout: hybridMLA, Tokens: 64, Targets: []Target{{}}},
			want: 64 * (576*2 + 132) * 32,
		},
		{
			// Non-last chunk of hybrid-linear: KV only.
			name: "hybrid linear chunk", op: ChunkOp{Layout: hybridLinear, Tokens: 64, Targets: []Target{{NumHeads: 8}}},
			want: 64 * 2 * 8 * 128 * 2 * 32,
		},
		{
			// The last chunk carries the Mamba state (3 MiB).
			name: "hybrid linear last chunk", op: ChunkOp{Layout: hybridLinear, Tokens: 64, Last: true, Targets: []Target{{NumHeads: 8}}},
			want: 64*2*8*128*2*32 + 3<<20,
		},
		{name: "hybrid linear last chunk to a dummy", op: ChunkOp{Layout: hybridLinear, Tokens: 64, Last: true, Targets: []Target{{Dummy: true}}}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ChunkBytes(tc.op); got != tc.want {
				t.Errorf("ChunkBytes() = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestSimEngineTiming(t *testing.T) {
	bubble(t, func(t *testing.T) {
		gqa := layoutOf(t, nil)
		// 1000 tokens × 131072 B = 131072000 B at 64 GB/s = 2.048 ms, + 20 µs.
		e := NewSimEngine(SimConfig{BandwidthGBytesPerS: 64, Latency: 20 * time.Microsecond, Seed: 1}, RealClock{})
		op := ChunkOp{Layout: gqa, Tokens: 1000, Targets: []Target{{NumHeads: 8}}, Last: true, Marker: 77}
		start := time.Now()
		res, err := e.Transfer(context.Background(), op)
		if err != nil {
			t.Fatalf("Transfer = %v", err)
		}
		want := 20*time.Microsecond + 2048*time.Microsecond
		if el := time.Since(start); el != res.Duration || (el-want).Abs() > time.Nanosecond {
			t.Errorf("took %s (reported %s), want %s", el, res.Duration, want)
		}
		if res.Bytes != 131072000 || res.MarkerWritten != 77 {
			t.Errorf("result = %+v, want 131072000 bytes and marker 77", res)
		}
		// Not the last chunk: no marker.
		op.Last = false
		if res, _ := e.Transfer(context.Background(), op); res.MarkerWritten != 0 {
			t.Errorf("non-last chunk wrote marker %d", res.MarkerWritten)
		}
		// Cancellation ends a transfer at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		start = time.Now()
		if _, err := e.Transfer(ctx, op); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Transfer(cancelled) = %v, want DeadlineExceeded", err)
		}
		if el := time.Since(start); el != time.Millisecond {
			t.Errorf("cancelled transfer took %s, want 1ms", el)
		}
	})
}

func TestSimEngineFaults(t *testing.T) {
	bubble(t, func(t *testing.T) {
		gqa := layoutOf(t, nil)
		op := ChunkOp{Layout: gqa, Tokens: 64, Targets: []Target{{NumHeads: 8}}}
		always := NewSimEngine(SimConfig{FailureProbability: 1, Seed: 7}, nil)
		if _, err := always.Transfer(context.Background(), op); !errors.Is(err, ErrTransferFailed) || !strings.Contains(err.Error(), "transfer.sim.failure_probability = 1") {
			t.Errorf("Transfer with failure probability 1 = %v", err)
		}
		never := NewSimEngine(SimConfig{Seed: 7}, nil)
		never.SetFault(func(op ChunkOp) error {
			if op.ChunkIndex == 3 {
				return errors.New("injected: link down")
			}
			return nil
		})
		if _, err := never.Transfer(context.Background(), op); err != nil {
			t.Errorf("Transfer(chunk 0) = %v", err)
		}
		op.ChunkIndex = 3
		if _, err := never.Transfer(context.Background(), op); !errors.Is(err, ErrTransferFailed) || !strings.Contains(err.Error(), "injected: link down") {
			t.Errorf("Transfer(chunk 3) = %v, want the injected fault", err)
		}
		never.SetFault(nil)
		if _, err := never.Transfer(context.Background(), op); err != nil {
			t.Errorf("Transfer after clearing the fault = %v", err)
		}
		// A fixed seed gives a reproducible failure pattern.
		pattern := func() string {
			e := NewSimEngine(SimConfig{FailureProbability: 0.5, Seed: 42}, nil)
			var b strings.Builder
			for range 32 {
				if _, err := e.Transfer(context.Background(), op); err != nil {
					b.WriteByte('x')
				} else {
					b.WriteByte('.')
				}
			}
			return b.String()
		}
		if a, b := pattern(), pattern(); a != b || !strings.Contains(a, "x") || !strings.Contains(a, ".") {
			t.Errorf("seeded failure patterns %q and %q: want equal and mixed", a, b)
		}
	})
}

func TestSimFailureProbabilityFailsRooms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withSim(SimConfig{FailureProbability: 1, Seed: 3}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, RankID{Addr: addrA}, 0, 0, 16, true)); !errors.Is(err, ErrTransferFailed) {
			t.Fatalf("Transfer = %v, want ErrTransferFailed", err)
		}
		h.wantFailure(1, FailureTransferFailed, "KVTransferError(bootstrap_room=1): chunk 0 from 10.0.0.1:8998[dp 0 cp 0 tp 0 pp 0] failed: transfer failed: injected failure")
		h.assertClean()
	})
}

// unavailableEngine reports the engine unreachable once, then moves chunks.
type unavailableEngine struct {
	TransferEngine
	failed bool
}

func (e *unavailableEngine) Transfer(ctx context.Context, op ChunkOp) (ChunkResult, error) {
	if !e.failed {
		e.failed = true
		return ChunkResult{}, ErrEngineUnavailable
	}
	return e.TransferEngine.Transfer(ctx, op)
}

func TestEngineUnavailableIsRetryable(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withEngine(func(sim *SimEngine) TransferEngine { return &unavailableEngine{TransferEngine: sim} }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		req := chunk(1, RankID{Addr: addrA}, 0, 0, 16, true)
		if _, _, err := h.m.Transfer(context.Background(), req); !errors.Is(err, ErrEngineUnavailable) {
			t.Fatalf("Transfer = %v, want ErrEngineUnavailable", err)
		}
		h.wantPhase(1, PhaseClaimed)
		if _, dup, err := h.m.Transfer(context.Background(), req); err != nil || dup {
			t.Fatalf("Transfer(retry) = dup %v, %v", dup, err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

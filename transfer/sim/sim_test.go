package sim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// layoutOf derives a validated decode layout.
func layoutOf(t *testing.T, f func(*kvlayout.Config)) kvlayout.Layout {
	t.Helper()
	c := kvlayout.DefaultConfig()
	if f != nil {
		f(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return c.Layout()
}

func TestSimEngineTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gqa := layoutOf(t, nil)
		// 1000 tokens × 131072 B = 131072000 B at 64 GB/s = 2.048 ms, + 20 µs.
		e := sim.NewSimEngine(sim.SimConfig{BandwidthGBytesPerS: 64, Latency: 20 * time.Microsecond, Seed: 1}, kvlayout.RealClock{})
		op := transfer.ChunkOp{Layout: gqa, Tokens: 1000, Targets: []transfer.Target{{NumHeads: 8}}, Last: true, Marker: 77}
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
	synctest.Test(t, func(t *testing.T) {
		gqa := layoutOf(t, nil)
		op := transfer.ChunkOp{Layout: gqa, Tokens: 64, Targets: []transfer.Target{{NumHeads: 8}}}
		always := sim.NewSimEngine(sim.SimConfig{FailureProbability: 1, Seed: 7}, nil)
		if _, err := always.Transfer(context.Background(), op); !errors.Is(err, transfer.ErrTransferFailed) || !strings.Contains(err.Error(), "transfer.sim.failure_probability = 1") {
			t.Errorf("Transfer with failure probability 1 = %v", err)
		}
		never := sim.NewSimEngine(sim.SimConfig{Seed: 7}, nil)
		never.SetFault(func(op transfer.ChunkOp) error {
			if op.ChunkIndex == 3 {
				return errors.New("injected: link down")
			}
			return nil
		})
		if _, err := never.Transfer(context.Background(), op); err != nil {
			t.Errorf("Transfer(chunk 0) = %v", err)
		}
		op.ChunkIndex = 3
		if _, err := never.Transfer(context.Background(), op); !errors.Is(err, transfer.ErrTransferFailed) || !strings.Contains(err.Error(), "injected: link down") {
			t.Errorf("Transfer(chunk 3) = %v, want the injected fault", err)
		}
		never.SetFault(nil)
		if _, err := never.Transfer(context.Background(), op); err != nil {
			t.Errorf("Transfer after clearing the fault = %v", err)
		}
		// A fixed seed gives a reproducible failure pattern.
		pattern := func() string {
			e := sim.NewSimEngine(sim.SimConfig{FailureProbability: 0.5, Seed: 42}, nil)
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

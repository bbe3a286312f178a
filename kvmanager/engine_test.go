package kvmanager

import (
	"context"
	"errors"
	"testing"

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

func TestSimFailureProbabilityFailsRooms(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withSim(sim.SimConfig{FailureProbability: 1, Seed: 3}))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		if _, _, err := h.m.Transfer(context.Background(), chunk(1, RankID{Addr: addrA}, 0, 0, 16, true)); !errors.Is(err, transfer.ErrTransferFailed) {
			t.Fatalf("Transfer = %v, want transfer.ErrTransferFailed", err)
		}
		h.wantFailure(1, FailureTransferFailed, "KVTransferError(bootstrap_room=1): chunk 0 from 10.0.0.1:8998[dp 0 cp 0 tp 0 pp 0] failed: transfer failed: injected failure")
		h.assertClean()
	})
}

// unavailableEngine reports the engine unreachable once, then moves chunks.
type unavailableEngine struct {
	transfer.Engine
	failed bool
}

func (e *unavailableEngine) Transfer(ctx context.Context, op transfer.ChunkOp) (transfer.ChunkResult, error) {
	if !e.failed {
		e.failed = true
		return transfer.ChunkResult{}, transfer.ErrEngineUnavailable
	}
	return e.Engine.Transfer(ctx, op)
}

func TestEngineUnavailableIsRetryable(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withEngine(func(sim *sim.SimEngine) transfer.Engine { return &unavailableEngine{Engine: sim} }))
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		h.claimAll(1)
		req := chunk(1, RankID{Addr: addrA}, 0, 0, 16, true)
		if _, _, err := h.m.Transfer(context.Background(), req); !errors.Is(err, transfer.ErrEngineUnavailable) {
			t.Fatalf("Transfer = %v, want transfer.ErrEngineUnavailable", err)
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

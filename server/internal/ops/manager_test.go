package ops

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// newTestManager is a real room manager over one small ledger and the
// simulated transfer engine.
func newTestManager(tb testing.TB) *kvmanager.Manager {
	tb.Helper()
	dec := kvlayout.DefaultConfig()
	dec.Pool.Kind = kvlayout.KindGQA
	dec.Pool.NumLayers, dec.Pool.KVHeads, dec.Pool.HeadDim, dec.Pool.DType = 4, 8, 16, "bf16"
	dec.Pool.PageSize, dec.Pool.TotalTokens, dec.Pool.TotalPages, dec.Pool.RequestSlots = 16, 0, 512, 8
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		tb.Fatal(err)
	}
	kcfg := kvmanager.DefaultConfig()
	kcfg.Timeouts.HeartbeatInterval = time.Hour
	m, err := kvmanager.New(kcfg, dec, kvmanager.Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(sim.SimConfig{}, nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

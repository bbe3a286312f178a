package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// bufferLayout is a valid SGLang-shaped layout of decode rank tp for dec:
// every layer's K buffer, then every layer's V buffer, an output-ids
// column and the marker column.
func bufferLayout(dec kvlayout.Config, tp int) *kvlayout.BufferLayout {
	lay := dec.Layout()
	item, pages, slots := lay.ItemLen(), lay.TotalPages, int64(dec.Pool.Metadata())
	l := &kvlayout.BufferLayout{Marker: fmt.Sprintf("e/tp%d/aux/room", tp)}
	for kv, n := range []string{"k", "v"} {
		for layer := range lay.NumLayers {
			l.KV = append(l.KV, kvlayout.KVBuffer{Name: fmt.Sprintf("e/tp%d/%s/%d", tp, n, layer), Layer: layer, Value: kv == 1, ItemLen: item, Length: pages * item})
		}
	}
	l.Aux = []kvlayout.AuxBuffer{{Name: fmt.Sprintf("e/tp%d/aux/ids", tp), RowLen: 64, Length: slots * 64}, {Name: l.Marker, RowLen: 64, Length: slots * 64}}
	return l
}

// layoutEngine is the simulated engine with the delegated engine's layout
// capabilities: it records registrations, refuses them with err, and
// checks chunks with check.
type layoutEngine struct {
	*sim.SimEngine
	err   error
	got   []*kvlayout.BufferLayout
	check func(transfer.ChunkOp) error
	// dropped is what LayoutDropped says (every rank's); a registration
	// clears it.
	dropped string
}

func (e *layoutEngine) RegisterLayout(_ context.Context, _, _ int, l *kvlayout.BufferLayout) (bool, error) {
	if e.err != nil {
		return false, e.err
	}
	if n := len(e.got); n > 0 && e.got[n-1].Equal(l) && e.dropped == "" {
		return true, nil
	}
	e.got, e.dropped = append(e.got, l), ""
	return false, nil
}

func (e *layoutEngine) LayoutDropped(int, int) string { return e.dropped }

func (e *layoutEngine) CheckOp(op transfer.ChunkOp) error {
	if e.check != nil {
		return e.check(op)
	}
	return nil
}

// TestEngineLayoutRegistration: a layout is registered with the engine,
// kept by the rooms declared afterwards (their destinations weigh pages by
// it), refused while a hand-off of the shard holds pages unless it is the
// same, and accepted again once the hand-off ended.
func TestEngineLayoutRegistration(t *testing.T) {
	bubble(t, func(t *testing.T) {
		le := &layoutEngine{}
		h := newHarness(t, withDecode(engineOwnerPages(40)), withEngine(func(s *sim.SimEngine) transfer.Engine { le.SimEngine = s; return le }))
		ctx := context.Background()
		l := bufferLayout(h.dec, 0)
		if already, err := h.m.RegisterEngineLayout(ctx, 0, 0, l); err != nil || already {
			t.Fatalf("RegisterEngineLayout = %v, already %v", err, already)
		}
		if already, err := h.m.RegisterEngineLayout(ctx, 0, 0, bufferLayout(h.dec, 0)); err != nil || !already {
			t.Fatalf("the same layout again = %v, already %v; want already", err, already)
		}
		if len(le.got) != 1 || le.got[0] != l {
			t.Fatalf("the engine was given %d layouts, want the first one once", len(le.got))
		}
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 4, 16, 3); err != nil {
			t.Fatal(err)
		}
		lay := h.dec.Layout()
		for rk, d := range h.claimAll(1) {
			if want := 2 * int64(lay.NumLayers) * lay.ItemLen(); d.PageBytes != want || d.AuxBytes != 8+64 || d.TokenBytes != 0 || len(d.Layouts) != 1 || d.Layouts[0] != l {
				t.Fatalf("%s destination weighs page %d, aux %d, token %d (layouts %d); want page %d, aux 72, token 0, the registered layout", rk, d.PageBytes, d.AuxBytes, d.TokenBytes, len(d.Layouts), want)
			}
		}
		// A different layout while room 1 holds pages: refused; the same:
		// accepted.
		other := bufferLayout(h.dec, 0)
		other.Aux[0].Name = "e/tp0/aux/other"
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 0, other); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "1 hand-offs of the shard hold pages") {
			t.Fatalf("a different layout while a hand-off holds pages = %v; want ErrWrongState saying why", err)
		}
		if already, err := h.m.RegisterEngineLayout(ctx, 0, 0, bufferLayout(h.dec, 0)); err != nil || !already {
			t.Fatalf("the same layout while a hand-off holds pages = %v, already %v", err, already)
		}
		// ReportTransfer's bytes are weighed by the layout: whole pages.
		rk := h.requiredRanks(1)[0]
		req := chunk(1, rk, 0, 0, 16, true)
		req.Bytes = 16*2*int64(lay.NumLayers)*lay.ItemLen() + 72 - 1
		var inv *InvalidError
		if _, _, err := h.m.ReportTransfer(req); !errors.As(err, &inv) || inv.Field != "bytes" {
			t.Fatalf("ReportTransfer with a byte short = %v; want bytes refused", err)
		}
		req.Bytes++
		if _, _, err := h.m.ReportTransfer(req); err != nil {
			t.Fatalf("ReportTransfer with the layout's weight = %v", err)
		}
		h.wantPhase(1, PhaseSucceeded)
		if already, err := h.m.RegisterEngineLayout(ctx, 0, 0, other); err != nil || already {
			t.Fatalf("a different layout once the hand-off ended = %v, already %v", err, already)
		}
		if ls := h.m.EngineLayouts(); len(ls) != 1 || ls[0].Layout != other {
			t.Fatalf("EngineLayouts = %v, want the new layout", ls)
		}
		h.release(1)
	})
}

// TestEngineLayoutRefusals: the registration's own refusals, each naming
// the setting or field and changing nothing.
func TestEngineLayoutRefusals(t *testing.T) {
	bubble(t, func(t *testing.T) {
		le := &layoutEngine{err: errors.New("buffer \"e/tp0/k/0\": shared memory unusable: no such file")}
		h := newHarness(t, withDecode(decodes(engineOwnerPages(40), func(c *kvlayout.Config) { c.Parallel.AttnTP = 2 })),
			withEngine(func(s *sim.SimEngine) transfer.Engine { le.SimEngine = s; return le }))
		ctx := context.Background()
		var inv *InvalidError
		for _, tc := range []struct {
			name   string
			dp, tp int
			l      *kvlayout.BufferLayout
			field  string
		}{
			{"dp out of range", 1, 0, bufferLayout(h.dec, 0), "decode_dp_rank"},
			{"tp out of range", 0, 2, bufferLayout(h.dec, 0), "decode_tp_rank"},
			{"no layout", 0, 0, nil, "layout"},
			{"wrong item length", 0, 0, func() *kvlayout.BufferLayout { l := bufferLayout(h.dec, 0); l.KV[3].ItemLen++; return l }(), "layout.kv[3].item_len"},
		} {
			if _, err := h.m.RegisterEngineLayout(ctx, tc.dp, tc.tp, tc.l); !errors.As(err, &inv) || inv.Field != tc.field {
				t.Errorf("%s: %v; want an invalid %s", tc.name, err, tc.field)
			}
		}
		// The engine (the agent) refuses the buffers: FailedPrecondition
		// with its reason, nothing kept.
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 0, bufferLayout(h.dec, 0)); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "shared memory unusable") {
			t.Fatalf("a layout the engine refuses = %v; want ErrWrongState with its reason", err)
		}
		le.err = fmt.Errorf("%w: agent down", transfer.ErrEngineUnavailable)
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 0, bufferLayout(h.dec, 0)); !errors.Is(err, transfer.ErrEngineUnavailable) {
			t.Fatalf("a layout while the engine is unavailable = %v; want ErrEngineUnavailable", err)
		}
		if ls := h.m.EngineLayouts(); len(ls) != 0 {
			t.Fatalf("EngineLayouts after refusals = %v, want none", ls)
		}
		le.err = nil
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 0, bufferLayout(h.dec, 0)); err != nil {
			t.Fatal(err)
		}
		// tp 1 may not name tp 0's buffers.
		clash := bufferLayout(h.dec, 1)
		clash.KV[5].Name = "e/tp0/k/5"
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 1, clash); !errors.As(err, &inv) || inv.Field != "layout.kv[5].name" {
			t.Fatalf("tp 1 naming tp 0's buffer = %v; want layout.kv[5].name refused", err)
		}
		// A declaration on a shard where only tp 0 registered is refused;
		// once tp 1 did, accepted.
		h.register(instance{addr: addrA, tp: 2})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 0, 16, 0); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "not for tp 1") {
			t.Fatalf("declaring with tp 1's layout missing = %v; want ErrWrongState naming tp 1", err)
		}
		h.wantPhase(1, PhaseQueued)
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 1, bufferLayout(h.dec, 1)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := h.declare(1, 0, 16, 0); err != nil {
			t.Fatalf("declaring once every TP rank registered = %v", err)
		}
	})
}

// TestEngineLayoutOwnerAndStaging: the daemon's own pages, and the staged
// path, refuse a layout with the setting and the fix.
func TestEngineLayoutOwnerAndStaging(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		if _, err := h.m.RegisterEngineLayout(context.Background(), 0, 0, bufferLayout(h.dec, 0)); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "kv_pool.owner is daemon") {
			t.Errorf("with the daemon owning the pages = %v", err)
		}
		h = newHarness(t, withDecode(decodes(engineOwnerPages(40), func(c *kvlayout.Config) {
			c.Staging = kvlayout.StagingConfig{Enabled: true, PoolSizeMB: 64}
		})))
		if _, err := h.m.RegisterEngineLayout(context.Background(), 0, 0, bufferLayout(h.dec, 0)); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "staging.enabled: false") {
			t.Errorf("with staging on = %v", err)
		}
	})
}

// TestEngineLayoutChunkCheck: the engine's check of a chunk of a room with
// layouts refuses it before the room records anything.
func TestEngineLayoutChunkCheck(t *testing.T) {
	bubble(t, func(t *testing.T) {
		le := &layoutEngine{check: func(op transfer.ChunkOp) error {
			if len(op.Engine) == 0 {
				return errors.New("a room without layouts was checked")
			}
			if op.Last && op.SrcAuxRow < 0 {
				return &transfer.FieldError{Field: "source.aux_row", Msg: "is required"}
			}
			return nil
		}}
		h := newHarness(t, withDecode(engineOwnerPages(40)), withEngine(func(s *sim.SimEngine) transfer.Engine { le.SimEngine = s; return le }))
		if _, err := h.m.RegisterEngineLayout(context.Background(), 0, 0, bufferLayout(h.dec, 0)); err != nil {
			t.Fatal(err)
		}
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 0, 16, 0); err != nil {
			t.Fatal(err)
		}
		h.claimAll(1)
		rk := h.requiredRanks(1)[0]
		req := chunk(1, rk, 0, 0, 16, true)
		req.SrcAuxRow = -1
		var inv *InvalidError
		if _, _, err := h.m.Transfer(context.Background(), req); !errors.As(err, &inv) || inv.Field != "source.aux_row" {
			t.Fatalf("Transfer without the aux row = %v; want source.aux_row refused", err)
		}
		if s := h.snapshot(1); s.ChunksDone != 0 || s.Phase != PhaseClaimed {
			t.Fatalf("after the refusal the room is %s with %d chunks; want claimed, none", s.Phase, s.ChunksDone)
		}
		req.SrcAuxRow = 2
		if _, _, err := h.m.Transfer(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
	})
}

// TestEngineLayoutDropped: a layout the engine dropped (its memory is
// gone) is reported so; a declaration on its shard is refused until the
// engine registers it again — the same layout, accepted as new even while
// a room declared before holds pages, which keeps the old one.
func TestEngineLayoutDropped(t *testing.T) {
	bubble(t, func(t *testing.T) {
		le := &layoutEngine{}
		h := newHarness(t, withDecode(engineOwnerPages(40)), withEngine(func(s *sim.SimEngine) transfer.Engine { le.SimEngine = s; return le }))
		ctx := context.Background()
		l := bufferLayout(h.dec, 0)
		if _, err := h.m.RegisterEngineLayout(ctx, 0, 0, l); err != nil {
			t.Fatal(err)
		}
		h.register(instance{addr: addrA})
		h.open(addrA, 1)
		if _, _, err := h.declare(1, 4, 16, 3); err != nil {
			t.Fatal(err)
		}
		le.dropped = "the transfer agent refused its buffers on a health check: no such file"
		if ls := h.m.EngineLayouts(); len(ls) != 1 || ls[0].Dropped != le.dropped {
			t.Fatalf("EngineLayouts = %+v; want the layout reported dropped", ls)
		}
		h.open(addrA, 2)
		if _, _, err := h.declare(2, 20, 16, 4); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "was dropped (the transfer agent refused") {
			t.Fatalf("a declaration on a dropped layout = %v; want ErrWrongState saying why", err)
		}
		again := bufferLayout(h.dec, 0)
		if already, err := h.m.RegisterEngineLayout(ctx, 0, 0, again); err != nil || already {
			t.Fatalf("the dropped layout registered again while room 1 holds pages = %v, already %v; want registered anew", err, already)
		}
		if ls := h.m.EngineLayouts(); len(ls) != 1 || ls[0].Layout != again || ls[0].Dropped != "" {
			t.Fatalf("EngineLayouts = %+v; want the new registration", ls)
		}
		if _, _, err := h.declare(2, 20, 16, 4); err != nil {
			t.Fatal(err)
		}
		if d := h.claimAll(2); d[h.requiredRanks(2)[0]].Layouts[0] != again {
			t.Error("room 2 does not keep the new registration")
		}
		if d := h.claimAll(1); d[h.requiredRanks(1)[0]].Layouts[0] != l {
			t.Error("room 1 does not keep the layout it was declared with")
		}
	})
}

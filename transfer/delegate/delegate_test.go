package delegate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

var _ delegate.Agent = (*hostmem.Agent)(nil)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// stgDecode is a small GQA decode pool (4 layers, 8 KV heads × 16) at
// decode TP decodeTP, with staging on.
func stgDecode(decodeTP int) kvlayout.Config {
	dec := kvlayout.DefaultConfig()
	dec.Pool.Kind = kvlayout.KindGQA
	dec.Pool.NumLayers, dec.Pool.KVHeads, dec.Pool.HeadDim, dec.Pool.DType = 4, 8, 16, "bf16"
	dec.Pool.PageSize, dec.Pool.TotalTokens, dec.Pool.TotalPages, dec.Pool.RequestSlots = 16, 0, 512, 8
	dec.Parallel.AttnTP = decodeTP
	dec.Staging = kvlayout.StagingConfig{Enabled: true, PoolSizeMB: 1}
	return dec
}

// pat is the byte every copy must carry for (layer, kv, token, global head,
// byte): distinct enough that a misplaced row shows.
func pat(layer, kv, token, head, b int) byte {
	x := uint64(layer)*0x9e3779b97f4a7c15 ^ uint64(kv)<<40 ^ uint64(token)*0xbf58476d1ce4e5b9 ^ uint64(head)<<20 ^ uint64(b)
	x ^= x >> 29
	x *= 0x94d049bb133111eb
	return byte(x>>32) | 1 // never 0: untouched bytes stay 0
}

func gqaLayout(tp int) kvlayout.Layout {
	dec := stgDecode(tp)
	return dec.Layout()
}

func mlaLayout() kvlayout.Layout {
	dec := stgDecode(1)
	dec.Pool.Kind, dec.Pool.KVLoraRank, dec.Pool.QKRopeHeadDim, dec.Staging.Enabled = kvlayout.KindMLA, 32, 16, false
	return dec.Layout()
}

// fillPrefill writes logical pages [0, n) of a prefill rank at src page
// srcPage(i) in buffer name (heads [rank·hp, +hp), layers of its stage).
func fillPrefill(t *testing.T, st *hostmem.Store, name string, l kvlayout.Layout, ptp, pp, ppRank, tpRank, n int, srcPage func(int) int) {
	t.Helper()
	g := kvcopy.PrefillKV(l, ptp, pp, ppRank)
	lb, _ := transfer.StageLayers(l.NumLayers, pp, ppRank)
	if _, err := st.Register([]kvcopy.BufferSpec{{Name: name, Kind: kvcopy.KindPrefillKV, Length: g.Size(64)}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		page := make([]byte, g.PageBytes())
		for li := range g.Layers {
			for tok := range g.PageSize {
				if g.MLA {
					for b := range g.RowBytes {
						page[g.RowOffset(0, li, tok)+int64(b)] = pat(lb+li, 0, i*g.PageSize+tok, 0, int(b))
					}
					continue
				}
				for kv := range 2 {
					for h := range g.Heads {
						for b := range g.HeadBytes {
							page[g.Offset(0, li, kv, tok, h)+b] = pat(lb+li, kv, i*g.PageSize+tok, tpRank*g.Heads+h, int(b))
						}
					}
				}
			}
		}
		if err := st.Write(name, int64(srcPage(i))*g.PageBytes(), page); err != nil {
			t.Fatal(err)
		}
	}
}

// checkDecode verifies every byte of decode rank e's pages: the heads in
// [dstStart, dstStart+n) of layers [lb, le) hold the pattern of global heads
// [globalStart, +n); every other byte is still 0.
func checkDecode(t *testing.T, st *hostmem.Store, l kvlayout.Layout, e int, pages []int32, dstStart, globalStart, n, lb, le int) {
	t.Helper()
	g := kvcopy.DecodeKV(l)
	name := kvcopy.DecodeKVName(0, e)
	for i, p := range pages {
		got, err := st.Read(name, int64(p)*g.PageBytes(), g.PageBytes())
		if err != nil {
			t.Fatal(err)
		}
		for layer := range g.Layers {
			for tok := range g.PageSize {
				if g.MLA {
					for b := range g.RowBytes {
						want := byte(0)
						if layer >= lb && layer < le {
							want = pat(layer, 0, i*g.PageSize+tok, 0, int(b))
						}
						if v := got[g.RowOffset(0, layer, tok)+int64(b)]; v != want {
							t.Fatalf("decode tp %d page %d layer %d token %d byte %d = %#x, want %#x", e, p, layer, tok, b, v, want)
						}
					}
					continue
				}
				for kv := range 2 {
					for h := range g.Heads {
						for b := range g.HeadBytes {
							want := byte(0)
							if layer >= lb && layer < le && h >= dstStart && h < dstStart+n {
								want = pat(layer, kv, i*g.PageSize+tok, globalStart+h-dstStart, int(b))
							}
							if v := got[g.Offset(0, layer, kv, tok, h)+b]; v != want {
								t.Fatalf("decode tp %d page %d layer %d kv %d token %d head %d byte %d = %#x, want %#x", e, p, layer, kv, tok, h, b, v, want)
							}
						}
					}
				}
			}
		}
	}
}

func TestTransferBatchBytes(t *testing.T) {
	tests := []struct {
		name                 string
		l                    kvlayout.Layout
		ptp, pp, ppRank, tpr int
	}{
		{name: "equal TP 2: whole pages", l: gqaLayout(2), ptp: 2, pp: 1, tpr: 1},
		{name: "prefill TP 2 into decode TP 4: head slices", l: gqaLayout(4), ptp: 2, pp: 1, tpr: 1},
		{name: "prefill TP 4 into decode TP 2: head slices", l: gqaLayout(2), ptp: 4, pp: 1, tpr: 3},
		{name: "prefill PP 2 stage 1, equal TP", l: gqaLayout(2), ptp: 2, pp: 2, ppRank: 1, tpr: 0},
		{name: "prefill PP 2 stage 0, TP 4 into 2", l: gqaLayout(2), ptp: 4, pp: 2, ppRank: 0, tpr: 2},
		{name: "MLA", l: mlaLayout(), ptp: 2, pp: 1, tpr: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := hostmem.New(0)
			l := tc.l
			if _, err := st.Register(kvcopy.DecodeBuffers(l, 0, 8)); err != nil {
				t.Fatal(err)
			}
			srcPage := func(i int) int { return 40 - 3*i }
			fillPrefill(t, st, "prefill", l, tc.ptp, tc.pp, tc.ppRank, tc.tpr, 5, srcPage)
			op := transfer.ChunkOp{Room: 5, Rank: transfer.Rank{TP: tc.tpr, PP: tc.ppRank}, DestPages: []int32{9, 2, 30, 31, 4},
				SrcBuffer: "prefill", Layout: l, PrefillTP: tc.ptp, PrefillPP: tc.pp, Last: true, MetadataSlot: 3, Marker: 5, OutputIDs: []int32{42, -1}}
			for i := range op.DestPages {
				op.SrcPages = append(op.SrcPages, int32(srcPage(i)))
			}
			var targets []int
			switch {
			case l.IsMLA:
				targets = []int{0}
				op.Targets = []transfer.Target{{DecodeTP: 0}}
			case tc.ptp >= l.AttnTP:
				e := tc.tpr / (tc.ptp / l.AttnTP)
				targets = []int{e}
			default:
				k := l.AttnTP / tc.ptp
				for e := tc.tpr * k; e < (tc.tpr+1)*k; e++ {
					targets = append(targets, e)
				}
			}
			if !l.IsMLA {
				for _, e := range targets {
					hs := kvmanager.ComputeHeadSliceParams(tc.ptp, l.AttnTP, tc.tpr, e, l.TotalKVHeads)
					op.Targets = append(op.Targets, transfer.Target{DecodeTP: e, SrcHeadStart: hs.SrcHeadStart, DstHeadStart: hs.DstHeadStart, NumHeads: hs.NumHeads})
				}
			}
			b, err := delegate.TransferBatch(op)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := st.Execute(context.Background(), b); err != nil {
				t.Fatal(err)
			}
			lb, le := transfer.StageLayers(l.NumLayers, tc.pp, tc.ppRank)
			hp := max(1, l.TotalKVHeads/tc.ptp)
			for i, e := range targets {
				tg := op.Targets[i]
				checkDecode(t, st, l, e, op.DestPages, tg.DstHeadStart, tc.tpr*hp+tg.SrcHeadStart, tg.NumHeads, lb, le)
			}
			slot, err := st.Read(kvcopy.MetadataName(0), 3*kvcopy.MetadataSlotBytes, kvcopy.MetadataSlotBytes)
			if err != nil {
				t.Fatal(err)
			}
			marker, ids, _ := kvcopy.DecodeMetadata(slot)
			if marker != 5 || ids[0] != 42 || ids[1] != -1 || ids[2] != 0 {
				t.Errorf("metadata slot 3 = marker %d ids %v, want 5 [42 -1 0 ...]", marker, ids)
			}
		})
	}
}

func TestScatterBatchBytes(t *testing.T) {
	// Prefill TP 4 into decode TP 2, prefill PP 2 into decode PP 1: decode
	// rank 1's region has 4 writers (stage, tp writer); writer (s, w) carries
	// heads [2w, 2w+2) of layers [2s, 2s+2) from prefill rank 2+w.
	l := gqaLayout(2)
	st := hostmem.New(0)
	if _, err := st.Register(kvcopy.DecodeBuffers(l, 1<<20, 8)); err != nil {
		t.Fatal(err)
	}
	dest := []int32{17, 3, 8}
	tokens := len(dest) * l.PageSize
	hb := int(l.HeadBytes())
	var writers []transfer.ScatterWriter
	var region []byte
	for s := range 2 {
		for w := range 2 {
			ws := transfer.ScatterWriter{DstHeadStart: 2 * w, NumHeads: 2,
				LayerBegin: 2 * s, LayerEnd: 2*s + 2, BytesPerToken: int64(2 * hb * 2 * 2), OffsetPerToken: int64(len(region) / tokens)}
			writers = append(writers, ws)
			// SGLang's layout: [K layers][V layers], each tokens × heads × dim.
			for kv := range 2 {
				for li := range 2 {
					for tok := range tokens {
						for h := range 2 {
							for b := range hb {
								region = append(region, pat(2*s+li, kv, tok, 4+2*w+h, b))
							}
						}
					}
				}
			}
		}
	}
	const off = 4096
	if err := st.Write(kvcopy.StagingName(0, 1), off, region); err != nil {
		t.Fatal(err)
	}
	op := transfer.ScatterOp{Room: 8, DecodeTP: 1, Layout: l, RingOffset: off, Tokens: tokens,
		DestPages: dest, Writers: writers, MetadataSlot: 1, Marker: 8}
	if got := op.Bytes(); got != int64(len(region)) {
		t.Fatalf("ScatterOp.Bytes() = %d, want %d", got, len(region))
	}
	b, err := delegate.ScatterBatch(op)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Execute(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	// Every head of every layer of decode rank 1 (global heads 4..7) landed.
	checkDecode(t, st, l, 1, dest, 0, 4, 4, 0, 4)
	slot, _ := st.Read(kvcopy.MetadataName(0), kvcopy.MetadataSlotBytes, kvcopy.MetadataSlotBytes)
	if marker, _, _ := kvcopy.DecodeMetadata(slot); marker != 8 {
		t.Errorf("metadata marker = %d, want 8", marker)
	}
}

// unreachableAgent is an agent that cannot be reached.
type unreachableAgent struct{}

func (unreachableAgent) RegisterBuffers(context.Context, []kvcopy.BufferSpec) error {
	return delegate.ErrAgentUnreachable
}
func (unreachableAgent) DeregisterBuffers(context.Context, []string) error {
	return delegate.ErrAgentUnreachable
}
func (unreachableAgent) Execute(context.Context, kvcopy.Batch) error {
	return delegate.ErrAgentUnreachable
}
func (unreachableAgent) CancelRoom(context.Context, uint64) error {
	return delegate.ErrAgentUnreachable
}
func (unreachableAgent) Check(context.Context) error {
	return fmt.Errorf("%w: connection refused", delegate.ErrAgentUnreachable)
}

// readiness records the engine's readiness callbacks.
type readiness struct {
	mu      sync.Mutex
	changes []bool
	ch      chan bool
}

func newReadiness() *readiness { return &readiness{ch: make(chan bool, 16)} }

func (r *readiness) on(ready bool, _ string) {
	r.mu.Lock()
	r.changes = append(r.changes, ready)
	r.mu.Unlock()
	r.ch <- ready
}

func chunkOp(l kvlayout.Layout) transfer.ChunkOp {
	return transfer.ChunkOp{Room: 3, DestPages: []int32{1}, SrcBuffer: "prefill", SrcPages: []int32{0}, Layout: l, PrefillTP: l.AttnTP, PrefillPP: 1,
		Targets: []transfer.Target{{DecodeTP: 0, NumHeads: l.HeadsPerRank}}}
}

func TestDelegateEngine(t *testing.T) {
	l := gqaLayout(1)
	cfg := delegate.DelegateConfig{Target: "agent:7700", BatchTimeout: 5 * time.Second, HealthInterval: time.Second}

	t.Run("moves bytes and reports readiness", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := hostmem.New(0)
			agent := hostmem.NewAgent(st)
			rd := newReadiness()
			eng := delegate.NewDelegateEngine(cfg, agent, delegate.DelegateDeps{Buffers: kvcopy.DecodeBuffers(l, 0, 4), OnReadiness: rd.on, Logger: quiet})
			if _, err := eng.Transfer(context.Background(), chunkOp(l)); !errors.Is(err, transfer.ErrEngineUnavailable) {
				t.Fatalf("Transfer before the first health check = %v, want ErrEngineUnavailable", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- eng.Run(ctx) }()
			if !<-rd.ch {
				t.Fatal("first readiness change is not ready")
			}
			fillPrefill(t, st, "prefill", l, 1, 1, 0, 0, 1, func(int) int { return 0 })
			res, err := eng.Transfer(context.Background(), chunkOp(l))
			if err != nil || res.Bytes != kvcopy.DecodeKV(l).PageBytes() {
				t.Fatalf("Transfer = %+v, %v; want one page moved", res, err)
			}
			checkDecode(t, st, l, 0, []int32{1}, 0, 0, l.HeadsPerRank, 0, l.NumLayers)
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run = %v, want context.Canceled", err)
			}
		})
	})

	t.Run("a failed batch fails the chunk with the agent's reason", func(t *testing.T) {
		st := hostmem.New(0)
		agent := hostmem.NewAgent(st)
		agent.SetFault(func(b kvcopy.Batch) error { return fmt.Errorf("copy 0 of %s: NVLink error", b.ID) })
		rd := newReadiness()
		eng := delegate.NewDelegateEngine(cfg, agent, delegate.DelegateDeps{Buffers: kvcopy.DecodeBuffers(l, 0, 4), OnReadiness: rd.on, Logger: quiet})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error)
		go func() { done <- eng.Run(ctx) }()
		<-rd.ch
		fillPrefill(t, st, "prefill", l, 1, 1, 0, 0, 1, func(int) int { return 0 })
		_, err := eng.Transfer(context.Background(), chunkOp(l))
		if !errors.Is(err, transfer.ErrTransferFailed) || !strings.Contains(err.Error(), "NVLink error") {
			t.Errorf("Transfer = %v, want ErrTransferFailed with the agent's reason", err)
		}
		cancel()
		<-done
	})

	t.Run("an unreachable agent is unavailable and not ready", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			rd := newReadiness()
			eng := delegate.NewDelegateEngine(cfg, unreachableAgent{}, delegate.DelegateDeps{OnReadiness: rd.on, Logger: quiet})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- eng.Run(ctx) }()
			synctest.Wait()
			if ready, reason := eng.Ready(); ready || !strings.Contains(reason, "connection refused") {
				t.Errorf("Ready() = %v, %q; want not ready, with the reason", ready, reason)
			}
			if _, err := eng.Transfer(context.Background(), chunkOp(l)); !errors.Is(err, transfer.ErrEngineUnavailable) {
				t.Errorf("Transfer = %v, want ErrEngineUnavailable", err)
			}
			cancel()
			<-done
			// The first probe is published (so that the operator learns why
			// the daemon is not ready), and nothing after it: never ready.
			if len(rd.changes) != 1 || rd.changes[0] {
				t.Errorf("readiness changes %v, want one: not ready", rd.changes)
			}
		})
	})

	t.Run("a batch past its deadline is cancelled at the agent", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			st := hostmem.New(0)
			agent := hostmem.NewAgent(st)
			agent.SetHold(func(kvcopy.Batch) bool { return true })
			rd := newReadiness()
			eng := delegate.NewDelegateEngine(cfg, agent, delegate.DelegateDeps{Buffers: kvcopy.DecodeBuffers(l, 0, 4), OnReadiness: rd.on, Logger: quiet})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- eng.Run(ctx) }()
			<-rd.ch
			fillPrefill(t, st, "prefill", l, 1, 1, 0, 0, 1, func(int) int { return 0 })
			start := time.Now()
			_, err := eng.Transfer(context.Background(), chunkOp(l))
			if !errors.Is(err, transfer.ErrTransferFailed) || time.Since(start) < cfg.BatchTimeout {
				t.Errorf("Transfer of a held batch = %v after %s; want ErrTransferFailed after the %s batch timeout", err, time.Since(start), cfg.BatchTimeout)
			}
			if n := agent.InFlight(); n != 0 {
				t.Errorf("%d batches still in flight at the agent", n)
			}
			cancel()
			<-done
		})
	})
}

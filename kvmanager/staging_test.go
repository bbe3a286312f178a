package kvmanager_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/kvmanager/staging"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// stgEnv is a manager with one decode DP shard, a small GQA pool (4 layers,
// 8 KV heads of 16 × bf16, pages of 16 tokens) and a 1 MiB staging ring.
type stgEnv struct {
	t   *testing.T
	m   *kvmanager.Manager
	sim *sim.SimEngine
	led *prealloc.Ledger
	// dests are the destinations each rank received, by room and TP rank.
	dests map[[2]uint64]*kvmanager.Destination
}

// weight is what pages [off, off+n) of room weigh for TP rank r, by the
// destination it received (the bytes a ReportTransfer must carry).
func (e *stgEnv) weight(room uint64, r, off, n int, last bool) int64 {
	d := e.dests[[2]uint64{room, uint64(r)}]
	if d == nil {
		e.t.Fatalf("no destination for room %d rank %d", room, r)
	}
	tokens := min((off+n)*d.PageSize, d.FillLen) - off*d.PageSize
	w := int64(max(tokens, 0)) * d.TokenBytes
	if last {
		w += d.StateBytes
	}
	return w
}

func stgDecode(decodeTP int) kvlayout.Config {
	dec := kvlayout.DefaultConfig()
	dec.Pool.Kind = kvlayout.KindGQA
	dec.Pool.NumLayers, dec.Pool.KVHeads, dec.Pool.HeadDim, dec.Pool.DType = 4, 8, 16, "bf16"
	dec.Pool.PageSize, dec.Pool.TotalTokens, dec.Pool.TotalPages, dec.Pool.RequestSlots = 16, 0, 512, 8
	dec.Parallel.AttnTP = decodeTP
	dec.Staging = kvlayout.StagingConfig{Enabled: true, PoolSizeMB: 1}
	return dec
}

func newStgEnv(t *testing.T, dec kvlayout.Config, simCfg sim.SimConfig, engine func(*sim.SimEngine) transfer.Engine) *stgEnv {
	t.Helper()
	if err := dec.Validate(); err != nil {
		t.Fatalf("decode config: %v", err)
	}
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		t.Fatal(err)
	}
	e := &stgEnv{t: t, sim: sim.NewSimEngine(simCfg, nil), led: led}
	var eng transfer.Engine = e.sim
	if engine != nil {
		eng = engine(e.sim)
	}
	cfg := kvmanager.DefaultConfig()
	cfg.Timeouts.HeartbeatInterval = time.Hour
	m, err := kvmanager.New(cfg, dec, kvmanager.Deps{Ledgers: []*prealloc.Ledger{led}, Engine: eng, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	t.Cleanup(func() { m.Shutdown(context.Background()) })
	return e
}

func (e *stgEnv) register(addr string, tp, pp int) {
	e.t.Helper()
	for s := range pp {
		for r := range tp {
			_, err := e.m.RegisterPrefill(kvmanager.Registration{Addr: addr, Endpoint: fmt.Sprintf("10.0.%d.%d:9000", s, r), InstanceID: "i-" + addr,
				Parallel: kvmanager.ParallelInfo{AttnTP: tp, AttnTPRank: r, AttnCP: 1, AttnDP: 1, PP: pp, PPRank: s}, PageSize: 16, KVDType: "bf16"})
			if err != nil {
				e.t.Fatalf("RegisterPrefill(%s tp %d pp %d): %v", addr, r, s, err)
			}
		}
	}
}

func rank(addr string, tp int) kvmanager.RankID { return kvmanager.RankID{Addr: addr, TP: tp} }

// open opens a room and claims it from every rank; it returns the pages.
func (e *stgEnv) open(addr string, tp int, room uint64, prompt int) []int32 {
	e.t.Helper()
	if _, _, err := e.m.OpenRoom(context.Background(), kvmanager.OpenRequest{RID: fmt.Sprint(room), Addr: addr, Room: room, PrefillDP: -1, DecodeDP: -1,
		PromptLen: prompt, MaxNewTokens: 4}); err != nil {
		e.t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	var pages []int32
	for r := range tp {
		c, err := e.m.AwaitDestination(room, rank(addr, r))
		if err != nil {
			e.t.Fatal(err)
		}
		select {
		case ev := <-c.Events():
			if ev.Destination == nil {
				e.t.Fatalf("claim of room %d by rank %d: %+v, want a destination", room, r, ev)
			}
			c.Delivered(ev.Destination)
			pages = ev.Destination.Pages
			if e.dests == nil {
				e.dests = map[[2]uint64]*kvmanager.Destination{}
			}
			e.dests[[2]uint64{room, uint64(r)}] = ev.Destination
		default:
			e.t.Fatalf("room %d: no destination for rank %d", room, r)
		}
		c.Close()
	}
	return pages
}

func (e *stgEnv) phase(room uint64) (kvmanager.Phase, *kvmanager.Failure) {
	e.t.Helper()
	s, err := e.m.GetRoom(room, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return s.Phase, s.Failure
}

func (e *stgEnv) alloc(addr string, r int, room uint64, chunk, pages int) []kvmanager.StagingRegion {
	e.t.Helper()
	regs, err := e.m.AllocateStaging(room, rank(addr, r), chunk, pages)
	if err != nil {
		e.t.Fatalf("AllocateStaging(room %d rank %d chunk %d): %v", room, r, chunk, err)
	}
	return regs
}

func (e *stgEnv) ready(addr string, r int, room uint64, chunk, off, pages int, last bool) kvmanager.StagingChunkResult {
	e.t.Helper()
	req := kvmanager.ChunkRequest{Room: room, Rank: rank(addr, r), Index: chunk, PageOffset: off, NumPages: pages, Last: last}
	if last {
		req.Marker = room
	}
	res, err := e.m.StagingChunkReady(context.Background(), req)
	if err != nil {
		e.t.Fatalf("StagingChunkReady(room %d rank %d chunk %d): %v", room, r, chunk, err)
	}
	return res
}

// settled checks every ledger is full and every ring empty.
func (e *stgEnv) settled() {
	e.t.Helper()
	st := e.led.Stats()
	if st.Pages.Free != st.Pages.Total || st.ReqSlots.Free != st.ReqSlots.Total || st.MetaSlots.Free != st.MetaSlots.Total {
		e.t.Errorf("ledger not full: %+v", st)
	}
	for _, w := range e.m.StagingWatermarks() {
		if w.Live != 0 || w.Round != w.HeadRound || w.Tail != w.Head {
			e.t.Errorf("ring of decode tp %d not empty: %+v", w.DecodeTP, w)
		}
	}
}

func TestSetupStagingPlan(t *testing.T) {
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	e.register("p4:1", 4, 1)
	plan, err := e.m.SetupStaging(rank("p4:1", 3))
	if err != nil {
		t.Fatal(err)
	}
	// 4 heads per decode rank, 2 per prefill rank: rank 3 is writer 1 of
	// decode rank 1, dst heads [2, 4). Per token: 2 heads × 32 B × 4 layers × 2.
	w0 := kvmanager.StagingWriter{Index: 0, PrefillTP: 2, Slice: kvmanager.StagingHeadSlice{NumHeads: 2}, LayerEnd: 4, BytesPerToken: 512}
	w1 := kvmanager.StagingWriter{Index: 1, PrefillTP: 3, Slice: kvmanager.StagingHeadSlice{DstHeadStart: 2, NumHeads: 2}, LayerEnd: 4, BytesPerToken: 512, OffsetPerToken: 512}
	want := kvmanager.StagingPlan{
		Required: true, PrefillTP: 4, DecodeTP: 2, PrefillPP: 1, DecodePP: 1, TotalKVHeads: 8, PageSize: 16, NumLayers: 4, HeadBytes: 32,
		Pairs: []kvmanager.HeadSlicePair{
			{PrefillTP: 0, DecodeTP: 0, Slice: kvmanager.StagingHeadSlice{NumHeads: 2}},
			{PrefillTP: 1, DecodeTP: 0, Slice: kvmanager.StagingHeadSlice{DstHeadStart: 2, NumHeads: 2}},
			{PrefillTP: 2, DecodeTP: 1, Slice: kvmanager.StagingHeadSlice{NumHeads: 2}},
			{PrefillTP: 3, DecodeTP: 1, Slice: kvmanager.StagingHeadSlice{DstHeadStart: 2, NumHeads: 2}},
		},
		Targets:           []kvmanager.StagingTarget{{DecodeTP: 1, Slice: w1.Slice, Writer: w1, Writers: []kvmanager.StagingWriter{w0, w1}, RegionBytesPerToken: 1024}},
		Rings:             []kvmanager.StagingRingInfo{{DecodeDP: 0, DecodeTP: 1, Buffer: "decode/dp0/tp1/staging", Size: 1 << 20, Watermark: kvmanager.Watermark{DecodeTP: 1, Size: 1 << 20}}},
		CompletionTimeout: 300 * time.Second,
	}
	if diff := cmp.Diff(want, plan); diff != "" {
		t.Errorf("SetupStaging(rank 3) mismatch (-want +got):\n%s", diff)
	}

	// Prefill PP 2 into decode PP 1: every stage is a writer of its layers,
	// in order (stage, tp writer).
	e.register("pp2:1", 4, 2)
	plan, err = e.m.SetupStaging(kvmanager.RankID{Addr: "pp2:1", TP: 1, PP: 1})
	if err != nil {
		t.Fatal(err)
	}
	var got []kvmanager.StagingWriter
	if len(plan.Targets) == 1 {
		got = plan.Targets[0].Writers
	}
	wantW := []kvmanager.StagingWriter{
		{Index: 0, PrefillTP: 0, PrefillPP: 0, Slice: kvmanager.StagingHeadSlice{NumHeads: 2}, LayerBegin: 0, LayerEnd: 2, BytesPerToken: 256},
		{Index: 1, PrefillTP: 1, PrefillPP: 0, Slice: kvmanager.StagingHeadSlice{DstHeadStart: 2, NumHeads: 2}, LayerBegin: 0, LayerEnd: 2, BytesPerToken: 256, OffsetPerToken: 256},
		{Index: 2, PrefillTP: 0, PrefillPP: 1, Slice: kvmanager.StagingHeadSlice{NumHeads: 2}, LayerBegin: 2, LayerEnd: 4, BytesPerToken: 256, OffsetPerToken: 512},
		{Index: 3, PrefillTP: 1, PrefillPP: 1, Slice: kvmanager.StagingHeadSlice{DstHeadStart: 2, NumHeads: 2}, LayerBegin: 2, LayerEnd: 4, BytesPerToken: 256, OffsetPerToken: 768},
	}
	if diff := cmp.Diff(wantW, got); diff != "" {
		t.Errorf("writers with prefill PP 2 mismatch (-want +got):\n%s", diff)
	}
	if plan.Targets[0].Writer.Index != 3 {
		t.Errorf("rank tp 1 pp 1 is writer %d, want 3", plan.Targets[0].Writer.Index)
	}

	// Equal TP: staging is not required, and the plan says so.
	e.register("p2:1", 2, 1)
	if plan, err := e.m.SetupStaging(rank("p2:1", 0)); err != nil || plan.Required {
		t.Errorf("SetupStaging(equal TP) = required %v, %v; want not required", plan.Required, err)
	}
}

func TestSetupStagingRefusals(t *testing.T) {
	mla := stgDecode(1)
	mla.Pool.Kind, mla.Pool.KVLoraRank, mla.Pool.QKRopeHeadDim, mla.Staging.Enabled = kvlayout.KindMLA, 32, 16, false
	hybridMLA := mla
	hybridMLA.Pool.Kind = kvlayout.KindHybridMLA
	off := stgDecode(2)
	off.Staging.Enabled = false
	tests := []struct {
		name     string
		dec      kvlayout.Config
		wantMsg  string // exact, or a prefix when wantPart
		wantPart bool
	}{
		{name: "MLA pool", dec: mla, wantMsg: kvlayout.MsgStagingMLA},
		{name: "hybrid-MLA pool", dec: hybridMLA, wantMsg: kvlayout.MsgStagingMLA},
		{name: "staging not configured", dec: off, wantMsg: "Staging is enabled on the prefill side but this decode instance has no staging allocator", wantPart: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newStgEnv(t, tc.dec, sim.SimConfig{}, nil)
			e.register("p:1", 4, 1)
			_, err := e.m.SetupStaging(rank("p:1", 0))
			var se *kvmanager.StagingError
			if !errors.As(err, &se) || !errors.Is(err, kvmanager.ErrStagingUnavailable) {
				t.Fatalf("SetupStaging error = %v, want a *StagingError (ErrStagingUnavailable)", err)
			}
			if got := err.Error(); (tc.wantPart && !strings.HasPrefix(got, tc.wantMsg)) || (!tc.wantPart && got != tc.wantMsg) {
				t.Errorf("SetupStaging error = %q, want %q", got, tc.wantMsg)
			}
		})
	}
	t.Run("engine without scatter", func(t *testing.T) {
		e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, func(s *sim.SimEngine) transfer.Engine { return transferOnly{s} })
		e.register("p:1", 4, 1)
		if _, err := e.m.SetupStaging(rank("p:1", 0)); !errors.Is(err, kvmanager.ErrStagingUnavailable) || !strings.Contains(err.Error(), "cannot scatter") {
			t.Errorf("SetupStaging = %v, want ErrStagingUnavailable (cannot scatter)", err)
		}
	})
	t.Run("unknown prefill", func(t *testing.T) {
		e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
		if _, err := e.m.SetupStaging(rank("nobody:1", 0)); !errors.Is(err, kvmanager.ErrPrefillNotFound) {
			t.Errorf("SetupStaging = %v, want ErrPrefillNotFound", err)
		}
	})
}

// transferOnly hides SimEngine's Scatter.
type transferOnly struct{ s *sim.SimEngine }

func (e transferOnly) Transfer(ctx context.Context, op transfer.ChunkOp) (transfer.ChunkResult, error) {
	return e.s.Transfer(ctx, op)
}

func TestStagingRoomFourToTwo(t *testing.T) {
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	const addr, room = "p4:1", 7
	e.register(addr, 4, 1)
	pages := e.open(addr, 4, room, 100) // 7 pages
	if len(pages) != 7 {
		t.Fatalf("%d pages, want 7", len(pages))
	}
	// Chunk 0: 4 pages = 64 tokens × 1024 B per decode rank; writer 1 starts
	// after writer 0's 64 × 512 B.
	a, b := e.alloc(addr, 0, room, 0, 4), e.alloc(addr, 1, room, 0, 4)
	wantA := kvmanager.StagingRegion{DecodeTP: 0, Buffer: "decode/dp0/tp0/staging", Region: kvmanager.RingRegion{ID: 0, Size: 65536}, NumPages: 4, Writable: true, NumWriters: 2, WriterBytes: 32768}
	wantB := wantA
	wantB.WriterIndex, wantB.WriterOffset, wantB.Existing = 1, 32768, true
	if diff := cmp.Diff([]kvmanager.StagingRegion{wantA}, a); diff != "" {
		t.Errorf("rank 0 region (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]kvmanager.StagingRegion{wantB}, b); diff != "" {
		t.Errorf("rank 1 region (-want +got):\n%s", diff)
	}
	if _, err := e.m.AllocateStaging(room, rank(addr, 1), 0, 3); !isInvalid(err) {
		t.Errorf("AllocateStaging with another num_pages = %v, want InvalidError", err)
	}
	for r := 2; r < 4; r++ {
		e.alloc(addr, r, room, 0, 4)
	}
	for r := range 4 {
		e.alloc(addr, r, room, 1, 3)
	}
	for r := range 4 {
		res := e.ready(addr, r, room, 0, 0, 4, false)
		if res.Scattered != (r%2 == 1) || res.NumWriters != 2 || res.Arrived != 1+r%2 {
			t.Errorf("ChunkReady(rank %d chunk 0) = %+v; want %d/2 writers, scattered %v", r, res, 1+r%2, r%2 == 1)
		}
	}
	if dup := e.ready(addr, 0, room, 0, 0, 4, false); !dup.Duplicate {
		t.Errorf("a repeated ChunkReady = %+v, want Duplicate", dup)
	}
	for r := range 3 {
		e.ready(addr, r, room, 1, 4, 3, true)
	}
	if ph, _ := e.phase(room); ph != kvmanager.PhaseTransferring {
		t.Fatalf("phase with one region unscattered = %s, want transferring (the staging gate holds success)", ph)
	}
	if res := e.ready(addr, 3, room, 1, 4, 3, true); !res.Scattered || res.Poll != kvmanager.PollSuccess {
		t.Errorf("the last ChunkReady = %+v, want scattered and Success", res)
	}
	if _, _, err := e.m.ReleaseRoom(room); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

func isInvalid(err error) bool {
	var inv *kvmanager.InvalidError
	return errors.As(err, &inv)
}

func TestStagingBackPressure(t *testing.T) {
	e := newStgEnv(t, stgDecode(1), sim.SimConfig{}, nil)
	const addr, room = "p2:1", 9
	e.register(addr, 2, 1)
	e.open(addr, 2, room, 1280) // 80 pages; decode TP 1: 2 writers × 4 heads
	// 2048 B per token (2 writers × 4 heads × 32 B × 4 layers × 2): a
	// 24-page chunk is 768 KiB, so the second one wraps over the first.
	watch, err := e.m.WatchWatermark(0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	first, err := watch.Next(context.Background())
	if err != nil || len(first) != 1 || first[0].Live != 0 {
		t.Fatalf("first watermark = %+v, %v; want an empty ring", first, err)
	}
	c0 := e.alloc(addr, 0, room, 0, 24)
	c1 := e.alloc(addr, 0, room, 1, 24)
	e.alloc(addr, 1, room, 0, 24)
	e.alloc(addr, 1, room, 1, 24)
	if !c0[0].Writable || c1[0].Writable || c1[0].Region.Round != 1 {
		t.Fatalf("regions %+v / %+v; want chunk 1 in round 1, not writable", c0[0].Region, c1[0].Region)
	}
	_, err = e.m.StagingChunkReady(context.Background(), kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), Index: 1, PageOffset: 24, NumPages: 24})
	if !errors.Is(err, kvmanager.ErrStagingNotWritable) {
		t.Fatalf("ChunkReady for an unreleased region = %v, want ErrStagingNotWritable", err)
	}
	e.ready(addr, 0, room, 0, 0, 24, false)
	e.ready(addr, 1, room, 0, 0, 24, false) // scatters and frees chunk 0
	var wm kvmanager.Watermark
	for wm.Live != 1 || wm.Round != 1 {
		got, err := watch.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		wm = got[0]
	}
	if !staging.WatermarkReady(wm.Round, wm.Tail, c1[0].Region.Round, c1[0].Region.End()) {
		t.Fatalf("after chunk 0's scatter the watermark %+v does not release chunk 1 %+v", wm, c1[0].Region)
	}
	e.ready(addr, 0, room, 1, 24, 24, false)
	e.ready(addr, 1, room, 1, 24, 24, false)
	// The rest in one 32-page chunk (1 MiB exactly).
	e.alloc(addr, 0, room, 2, 32)
	e.alloc(addr, 1, room, 2, 32)
	e.ready(addr, 0, room, 2, 48, 32, true)
	if res := e.ready(addr, 1, room, 2, 48, 32, true); res.Poll != kvmanager.PollSuccess {
		t.Fatalf("last ChunkReady = %+v, want Success", res)
	}
	if _, _, err := e.m.ReleaseRoom(room); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

func TestStagingChunkLargerThanRing(t *testing.T) {
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	const addr, room = "p4:1", 11
	e.register(addr, 4, 1)
	e.open(addr, 4, room, 1280)
	// 70 pages × 16 × 1024 B = 1120 KiB > 1 MiB.
	_, err := e.m.AllocateStaging(room, rank(addr, 2), 0, 70)
	if !errors.Is(err, kvmanager.ErrStagingTooLarge) || !strings.HasSuffix(err.Error(), kvmanager.StagingHint) {
		t.Fatalf("AllocateStaging(70 pages) = %v, want ErrStagingTooLarge ending with %q", err, kvmanager.StagingHint)
	}
	if ph, f := e.phase(room); ph != kvmanager.PhaseFailed || f.Code != kvmanager.FailureStagingFailed {
		t.Errorf("room = %s %+v, want failed (staging_failed)", ph, f)
	}
	e.settled()
}

func TestStagingTransferredRoomStillSucceeds(t *testing.T) {
	// A staged room whose prefill moved every chunk itself (no region ever
	// allocated) lifts the staging gate and succeeds.
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	const addr, room = "p4:1", 13
	e.register(addr, 4, 1)
	e.open(addr, 4, room, 40)
	for r := range 4 {
		if _, _, err := e.m.ReportTransfer(kvmanager.ChunkRequest{Room: room, Rank: rank(addr, r), Index: 0, NumPages: 3, Last: true, Marker: room, Bytes: e.weight(room, r, 0, 3, true)}); err != nil {
			t.Fatal(err)
		}
	}
	if ph, f := e.phase(room); ph != kvmanager.PhaseSucceeded {
		t.Fatalf("phase = %s %+v, want succeeded", ph, f)
	}
	if _, _, err := e.m.ReleaseRoom(room); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

// TestStagingUnreportedRegionDoesNotHoldTheRoom: a region allocated for
// pages the prefill then moved itself is never reported (its ChunkReady would
// overlap covered pages): once every page landed it does not hold the room
// back, and it is freed with the room.
func TestStagingUnreportedRegionDoesNotHoldTheRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
		const addr, room = "p1:1", 15
		e.register(addr, 1, 1)
		e.open(addr, 1, room, 100)
		e.alloc(addr, 0, room, 0, 4)
		e.alloc(addr, 0, room, 1, 3) // never reported
		e.ready(addr, 0, room, 0, 0, 4, false)
		if ph, _ := e.phase(room); ph != kvmanager.PhaseTransferring {
			t.Fatalf("phase = %s, want transferring", ph)
		}
		if _, _, err := e.m.ReportTransfer(kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), Index: 2, PageOffset: 4, NumPages: 3, Last: true, Marker: room, Bytes: e.weight(room, 0, 4, 3, true)}); err != nil {
			t.Fatal(err)
		}
		if ph, f := e.phase(room); ph != kvmanager.PhaseSucceeded {
			t.Fatalf("phase = %s %+v, want succeeded", ph, f)
		}
		if _, _, err := e.m.ReleaseRoom(room); err != nil {
			t.Fatal(err)
		}
		e.settled()
	})
}

// TestStagingRetryMustMatch: a ChunkReady retry with another page range is
// refused naming chunk_index, and changes nothing.
func TestStagingRetryMustMatch(t *testing.T) {
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	const addr, room = "p1:1", 16
	e.register(addr, 1, 1)
	pages := e.open(addr, 1, room, 100)
	e.alloc(addr, 0, room, 0, 3)
	e.ready(addr, 0, room, 0, 0, 3, false)
	_, err := e.m.StagingChunkReady(context.Background(), kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), Index: 0, PageOffset: 1, NumPages: 3})
	var inv *kvmanager.InvalidError
	if !errors.As(err, &inv) || inv.Field != "chunk_index" {
		t.Fatalf("retry with page_offset 1 = %v, want InvalidError on chunk_index", err)
	}
	e.alloc(addr, 0, room, 1, len(pages)-3)
	e.ready(addr, 0, room, 1, 3, len(pages)-3, true)
	if ph, f := e.phase(room); ph != kvmanager.PhaseSucceeded {
		t.Fatalf("phase = %s %+v, want succeeded", ph, f)
	}
	if _, _, err := e.m.ReleaseRoom(room); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

// unavailableScatter is the sim engine whose scatters never happen (the
// transfer agent is unreachable and no retry comes).
type unavailableScatter struct{ *sim.SimEngine }

func (unavailableScatter) Scatter(context.Context, transfer.ScatterOp) (transfer.ChunkResult, error) {
	return transfer.ChunkResult{}, fmt.Errorf("%w: test: agent unreachable", transfer.ErrEngineUnavailable)
}

// TestStagingCompletionTimeout: every writer reported its region, but the
// scatter never lands: the completion timeout fails the room naming it.
func TestStagingCompletionTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, func(s *sim.SimEngine) transfer.Engine { return unavailableScatter{s} })
		const addr, room = "p1:1", 15
		e.register(addr, 1, 1)
		pages := e.open(addr, 1, room, 100)
		e.alloc(addr, 0, room, 0, len(pages))
		start := time.Now()
		if _, err := e.m.StagingChunkReady(context.Background(), kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), Index: 0, NumPages: len(pages), Last: true, Marker: room}); !errors.Is(err, transfer.ErrEngineUnavailable) {
			t.Fatalf("StagingChunkReady = %v, want ErrEngineUnavailable", err)
		}
		if ph, _ := e.phase(room); ph != kvmanager.PhaseTransferring {
			t.Fatalf("phase = %s, want transferring", ph)
		}
		time.Sleep(300*time.Second - time.Millisecond)
		synctest.Wait()
		if ph, _ := e.phase(room); ph != kvmanager.PhaseTransferring {
			t.Fatalf("phase just before the completion timeout = %s, want transferring", ph)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		ph, f := e.phase(room)
		if ph != kvmanager.PhaseFailed || f.Code != kvmanager.FailureStagingFailed || !strings.Contains(f.Message, "chunk 0") {
			t.Fatalf("after %s: room %s %+v; want failed (staging_failed) naming chunk 0", time.Since(start), ph, f)
		}
		e.settled()
	})
}

func TestStagingAbortDuringScatter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Scatters take an hour: the abort arrives while one is in flight.
		e := newStgEnv(t, stgDecode(2), sim.SimConfig{Latency: time.Hour}, nil)
		const addr, room = "p1:1", 17
		e.register(addr, 1, 1)
		e.open(addr, 1, room, 40)
		e.alloc(addr, 0, room, 0, 3)
		errc := make(chan error, 1)
		go func() {
			_, err := e.m.StagingChunkReady(context.Background(), kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), NumPages: 3, Last: true, Marker: room})
			errc <- err
		}()
		synctest.Wait() // the scatter into decode rank 0 is in flight
		live := 0
		for _, w := range e.m.StagingWatermarks() {
			live += w.Live
		}
		if live != 2 {
			t.Fatalf("%d live regions during the scatter, want 2", live)
		}
		if _, _, err := e.m.AbortRoom(room, ""); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		select {
		case err := <-errc:
			if !errors.Is(err, kvmanager.ErrWrongState) {
				t.Errorf("ChunkReady of the aborted room = %v, want ErrWrongState", err)
			}
		default:
			t.Fatal("ChunkReady still blocked after the abort")
		}
		if ph, f := e.phase(room); ph != kvmanager.PhaseFailed || f.Code != kvmanager.FailureAborted {
			t.Errorf("room = %s %+v, want failed (aborted)", ph, f)
		}
		e.settled()
	})
}

func TestStagingScatterFailure(t *testing.T) {
	e := newStgEnv(t, stgDecode(2), sim.SimConfig{}, nil)
	e.sim.SetScatterFault(func(op transfer.ScatterOp) error {
		if op.DecodeTP == 1 {
			return errors.New("copy 3: ECC error")
		}
		return nil
	})
	const addr, room = "p1:1", 19
	e.register(addr, 1, 1)
	e.open(addr, 1, room, 40)
	e.alloc(addr, 0, room, 0, 3)
	_, err := e.m.StagingChunkReady(context.Background(), kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 0), NumPages: 3, Last: true, Marker: room})
	if !errors.Is(err, transfer.ErrTransferFailed) {
		t.Fatalf("ChunkReady with a failing scatter = %v, want ErrTransferFailed", err)
	}
	if ph, f := e.phase(room); ph != kvmanager.PhaseFailed || f.Code != kvmanager.FailureStagingFailed || !strings.Contains(f.Message, "ECC error") {
		t.Errorf("room = %s %+v, want failed (staging_failed) with the engine's reason", ph, f)
	}
	e.settled()
}

// flakyScatter is unavailable for its first scatters, then scatters.
type flakyScatter struct {
	*sim.SimEngine
	down int
}

func (f *flakyScatter) Scatter(ctx context.Context, op transfer.ScatterOp) (transfer.ChunkResult, error) {
	if f.down > 0 {
		f.down--
		return transfer.ChunkResult{}, fmt.Errorf("%w: agent restarting", transfer.ErrEngineUnavailable)
	}
	return f.SimEngine.Scatter(ctx, op)
}

func TestStagingUnavailableScatterIsRetried(t *testing.T) {
	flaky := &flakyScatter{down: 1}
	e := newStgEnv(t, stgDecode(1), sim.SimConfig{}, func(s *sim.SimEngine) transfer.Engine {
		flaky.SimEngine = s
		return flaky
	})
	const addr, room = "p2:1", 21
	e.register(addr, 2, 1)
	e.open(addr, 2, room, 40)
	e.alloc(addr, 0, room, 0, 3)
	e.alloc(addr, 1, room, 0, 3)
	e.ready(addr, 0, room, 0, 0, 3, true)
	req := kvmanager.ChunkRequest{Room: room, Rank: rank(addr, 1), NumPages: 3, Last: true, Marker: room}
	if _, err := e.m.StagingChunkReady(context.Background(), req); !errors.Is(err, transfer.ErrEngineUnavailable) {
		t.Fatalf("ChunkReady with the engine down = %v, want ErrEngineUnavailable", err)
	}
	if ph, _ := e.phase(room); ph != kvmanager.PhaseTransferring {
		t.Fatalf("phase after an unavailable scatter = %s, want transferring (nothing landed; retry)", ph)
	}
	res, err := e.m.StagingChunkReady(context.Background(), req)
	if err != nil || !res.Duplicate || !res.Scattered || res.Poll != kvmanager.PollSuccess {
		t.Fatalf("retried ChunkReady = %+v, %v; want a duplicate that scatters, Success", res, err)
	}
	if _, _, err := e.m.ReleaseRoom(room); err != nil {
		t.Fatal(err)
	}
	e.settled()
}

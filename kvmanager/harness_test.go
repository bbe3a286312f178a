package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// The harness builds a Manager over real prealloc ledgers and the simulated
// engine. Every test that builds one runs inside a synctest bubble (see
// bubble), so the manager's kvlayout.RealClock is the bubble's virtual clock: the
// manager's deadlines fire only when the test advances time with advance.

const (
	addrA = "10.0.0.1:8998"
	addrB = "10.0.0.2:8998"
)

// harness is one Manager with its ledgers and simulated engine.
type harness struct {
	t    *testing.T
	m    *Manager
	sim  *sim.SimEngine
	leds []*prealloc.Ledger
	dec  kvlayout.Config
	cfg  Config
}

type harnessOptions struct {
	dec    func(*kvlayout.Config)
	cfg    func(*Config)
	sim    sim.SimConfig
	shards int
	run    bool
	engine func(sim *sim.SimEngine) transfer.Engine
	obs    Observer
	log    *slog.Logger
	tp     trace.TracerProvider
}

type option func(*harnessOptions)

// withDecode adjusts the decode (ledger) configuration.
func withDecode(f func(*kvlayout.Config)) option {
	return func(o *harnessOptions) { o.dec = f }
}

// withConfig adjusts the manager configuration.
func withConfig(f func(*Config)) option {
	return func(o *harnessOptions) { o.cfg = f }
}

// withSim configures the simulated engine (default: instant, no faults).
func withSim(s sim.SimConfig) option {
	return func(o *harnessOptions) { o.sim = s }
}

// withShards sets the number of decode DP shards (ledgers).
func withShards(n int) option {
	return func(o *harnessOptions) { o.shards = n }
}

// withRun starts Manager.Run (heartbeat liveness, binding sweep) for the
// test; it is stopped in t.Cleanup.
func withRun() option {
	return func(o *harnessOptions) { o.run = true }
}

// withEngine wraps the simulated engine (to inject what it cannot).
func withEngine(f func(sim *sim.SimEngine) transfer.Engine) option {
	return func(o *harnessOptions) { o.engine = f }
}

// withLogger installs a logger (default: discard).
func withLogger(l *slog.Logger) option {
	return func(o *harnessOptions) { o.log = l }
}

// withTracer installs a tracer provider (default: none).
func withTracer(tp trace.TracerProvider) option {
	return func(o *harnessOptions) { o.tp = tp }
}

// withObserver installs an observer.
func withObserver(obs Observer) option {
	return func(o *harnessOptions) { o.obs = obs }
}

// mlaDecode turns the decode pool into a DeepSeek-style MLA pool.
func mlaDecode(kind kvlayout.Kind) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		c.Pool.Kind = kind
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	}
}

// newHarness builds the manager. It must be called inside a bubble.
func newHarness(t *testing.T, opts ...option) *harness {
	t.Helper()
	o := harnessOptions{shards: 1, sim: sim.SimConfig{Seed: 1}}
	for _, f := range opts {
		f(&o)
	}
	dec := kvlayout.DefaultConfig()
	dec.Parallel.DP = o.shards
	if o.dec != nil {
		o.dec(&dec)
	}
	if err := dec.Validate(); err != nil {
		t.Fatalf("decode config does not validate: %v", err)
	}
	cfg := DefaultConfig()
	if o.cfg != nil {
		o.cfg(&cfg)
	}
	h := &harness{t: t, dec: dec, cfg: cfg}
	var ledgers []*prealloc.Ledger
	for i := range o.shards {
		l, err := prealloc.NewLedger(dec, i)
		if err != nil {
			t.Fatalf("NewLedger(shard %d): %v", i, err)
		}
		h.leds = append(h.leds, l)
		ledgers = append(ledgers, l)
	}
	h.sim = sim.NewSimEngine(o.sim, kvlayout.RealClock{})
	var eng transfer.Engine = h.sim
	if o.engine != nil {
		eng = o.engine(h.sim)
	}
	logger := o.log
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	m, err := New(cfg, dec, Deps{Ledgers: ledgers, Engine: eng, Logger: logger, Observer: o.obs, TracerProvider: o.tp})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	h.m = m
	if o.run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- m.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Run() = %v, want context.Canceled", err)
			}
		})
	}
	return h
}

// bubble runs f in a synctest bubble.
func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}

// advance moves the bubble's clock by d and lets every timer due by then
// run to completion.
func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// instance describes a prefill instance to register.
type instance struct {
	addr       string
	tp, dp, pp int
	cp         int
	lb         string // load_balance_method; "" = follow_bootstrap_room
	instanceID string
	endpoint   string // endpoint prefix; "" = "tcp://rank"
	systemDP   bool   // DP as plain DP (system_dp_size) instead of attention DP
	dsaSplit   bool
}

func (in instance) sizes() (tp, dp, pp, cp int) {
	return max(1, in.tp), max(1, in.dp), max(1, in.pp), max(1, in.cp)
}

// registration builds one rank's registration with the decode side's page
// size and dtype.
func (h *harness) registration(in instance, dp, cp, tp, pp int) Registration {
	TP, DP, PP, CP := in.sizes()
	par := ParallelInfo{AttnTP: TP, AttnTPRank: tp, AttnCP: CP, AttnCPRank: cp, PP: PP, PPRank: pp, SystemDP: 1}
	if in.systemDP {
		par.AttnDP, par.SystemDP, par.SystemDPRank = 1, DP, dp
	} else {
		par.AttnDP, par.AttnDPRank = DP, dp
	}
	ep := in.endpoint
	if ep == "" {
		ep = "tcp://rank"
	}
	return Registration{
		Addr: in.addr, Endpoint: fmt.Sprintf("%s-%d-%d-%d-%d", ep, dp, cp, tp, pp), InstanceID: in.instanceID,
		Parallel: par, PageSize: h.dec.Pool.PageSize, KVDType: h.dec.Pool.DType, LoadBalanceMethod: in.lb,
		DSACacheLayerSplit: in.dsaSplit, HTTPPort: 30000,
	}
}

// ranksOf lists every rank of an instance, DP-major.
func ranksOf(in instance) []RankID {
	TP, DP, PP, CP := in.sizes()
	var out []RankID
	for dp := range DP {
		for cp := range CP {
			for tp := range TP {
				for pp := range PP {
					out = append(out, RankID{Addr: in.addr, DP: dp, CP: cp, TP: tp, PP: pp})
				}
			}
		}
	}
	return out
}

// register registers every rank of an instance and returns the last result.
func (h *harness) register(in instance) RegistrationResult {
	h.t.Helper()
	var res RegistrationResult
	for _, rk := range ranksOf(in) {
		var err error
		res, err = h.m.RegisterPrefill(h.registration(in, rk.DP, rk.CP, rk.TP, rk.PP))
		if err != nil {
			h.t.Fatalf("RegisterPrefill(%s) = %v", rk, err)
		}
	}
	if res.Registered != res.Expected {
		h.t.Fatalf("after registering every rank of %s: %d of %d registered", in.addr, res.Registered, res.Expected)
	}
	return res
}

// heartbeatAll heartbeats every rank of an instance.
func (h *harness) heartbeatAll(in instance) {
	h.t.Helper()
	for _, rk := range ranksOf(in) {
		if _, _, err := h.m.Heartbeat(rk, in.instanceID); err != nil {
			h.t.Fatalf("Heartbeat(%s) = %v", rk, err)
		}
	}
}

// openReq is the default request: 1000 prompt tokens (16 pages of 64).
func openReq(addr string, room uint64) OpenRequest {
	return OpenRequest{RID: fmt.Sprintf("rid-%d", room), Addr: addr, Room: room, PrefillDP: -1, DecodeDP: -1, PromptLen: 1000, MaxNewTokens: 128}
}

// open opens a room with the default request, adjusted by mods.
func (h *harness) open(addr string, room uint64, mods ...func(*OpenRequest)) RoomSnapshot {
	h.t.Helper()
	req := openReq(addr, room)
	for _, f := range mods {
		f(&req)
	}
	s, _, err := h.m.OpenRoom(context.Background(), req)
	if err != nil {
		h.t.Fatalf("OpenRoom(%d) = %v", room, err)
	}
	return s
}

// requiredRanks returns the prefill ranks whose KV a room needs.
func (h *harness) requiredRanks(room uint64) []RankID {
	h.t.Helper()
	h.m.lockAll()
	defer h.m.unlockAll()
	r := h.m.allRooms()[room]
	if r == nil || r.Plan() == nil || r.PrefillDP() < 0 {
		h.t.Fatalf("room %d has no plan yet", room)
	}
	var out []RankID
	for _, k := range r.Plan().Required() {
		out = append(out, RankID{Addr: r.Addr(), DP: r.PrefillDP(), CP: k.CP, TP: k.TP, PP: k.PP})
	}
	return out
}

// instanceComplete reports whether the instance at addr completed its registration.
func (h *harness) instanceComplete(addr string) bool {
	inst, ok := h.m.reg.Instance(addr)
	return ok && inst.Complete
}

// claim registers a rank's claim, takes the destination it must already
// have (the room is admitted) and reports it delivered.
func (h *harness) claim(room uint64, rank RankID) (*Claim, *Destination) {
	h.t.Helper()
	c, err := h.m.AwaitDestination(room, rank)
	if err != nil {
		h.t.Fatalf("AwaitDestination(%d, %s) = %v", room, rank, err)
	}
	d := h.destination(c)
	c.Delivered(d)
	return c, d
}

// destination takes the Destination event a claim must hold now.
func (h *harness) destination(c *Claim) *Destination {
	h.t.Helper()
	select {
	case ev, ok := <-c.Events():
		if !ok || ev.Destination == nil {
			h.t.Fatalf("claim of room %d by %s: got %+v (open %v), want a destination", c.room, c.rank, ev, ok)
		}
		return ev.Destination
	default:
		h.t.Fatalf("claim of room %d by %s: no destination queued", c.room, c.rank)
	}
	return nil
}

// claimAll claims a room as every required rank.
func (h *harness) claimAll(room uint64) map[RankID]*Destination {
	h.t.Helper()
	out := map[RankID]*Destination{}
	for _, rk := range h.requiredRanks(room) {
		_, d := h.claim(room, rk)
		out[rk] = d
	}
	return out
}

// chunk is a chunk request for pages [off, off+n) of a room.
func chunk(room uint64, rank RankID, idx, off, n int, last bool) ChunkRequest {
	req := ChunkRequest{Room: room, Rank: rank, Index: idx, PageOffset: off, NumPages: n, Last: last}
	if last {
		req.Marker = room
	}
	return req
}

// sendAll moves every page of a room from every required rank as one last
// chunk that writes the room's marker.
func (h *harness) sendAll(room uint64) {
	h.t.Helper()
	pages := h.snapshot(room).NumPages
	for _, rk := range h.requiredRanks(room) {
		if _, _, err := h.m.Transfer(context.Background(), chunk(room, rk, 0, 0, pages, true)); err != nil {
			h.t.Fatalf("Transfer(room %d, %s) = %v", room, rk, err)
		}
	}
}

// complete claims and transfers a room and checks it succeeded.
func (h *harness) complete(room uint64) {
	h.t.Helper()
	h.claimAll(room)
	h.sendAll(room)
	h.wantPhase(room, PhaseSucceeded)
}

// release releases a succeeded room.
func (h *harness) release(room uint64) {
	h.t.Helper()
	if _, _, err := h.m.ReleaseRoom(room); err != nil {
		h.t.Fatalf("ReleaseRoom(%d) = %v", room, err)
	}
}

func (h *harness) snapshot(room uint64) RoomSnapshot {
	h.t.Helper()
	s, err := h.m.GetRoom(room, false)
	if err != nil {
		h.t.Fatalf("GetRoom(%d) = %v", room, err)
	}
	return s
}

func (h *harness) wantPhase(room uint64, want Phase) RoomSnapshot {
	h.t.Helper()
	s := h.snapshot(room)
	if s.Phase != want {
		msg := ""
		if s.Failure != nil {
			msg = fmt.Sprintf(" (failure %s: %s)", s.Failure.Code, s.Failure.Message)
		}
		h.t.Fatalf("room %d phase = %s%s, want %s", room, s.Phase, msg, want)
	}
	return s
}

// wantFailure checks that a room failed with code and a message starting
// with prefix, and returns the message.
func (h *harness) wantFailure(room uint64, code FailureCode, prefix string) string {
	h.t.Helper()
	s := h.snapshot(room)
	if s.Phase != PhaseFailed || s.Failure == nil {
		h.t.Fatalf("room %d: phase %s, failure %v; want failed (%s)", room, s.Phase, s.Failure, code)
	}
	if s.Failure.Code != code || !strings.HasPrefix(s.Failure.Message, prefix) {
		h.t.Fatalf("room %d failure = %s %q, want %s %q...", room, s.Failure.Code, s.Failure.Message, code, prefix)
	}
	if s.Poll != PollFailed {
		h.t.Errorf("room %d poll = %s, want Failed", room, s.Poll)
	}
	return s.Failure.Message
}

// sglangSteps lists the SGLang transition labels of a room's timeline.
func (h *harness) sglangSteps(room uint64) []string {
	var out []string
	for _, tr := range h.snapshot(room).Transitions {
		out = append(out, tr.SGLang)
	}
	return out
}

// phases lists the phases of a room's timeline.
func (h *harness) phases(room uint64) []Phase {
	var out []Phase
	for _, tr := range h.snapshot(room).Transitions {
		out = append(out, tr.Phase)
	}
	return out
}

// stats returns the ledger stats of shard i.
func (h *harness) stats(i int) prealloc.Stats { return h.leds[i].Stats() }

// assertLedgersFull checks that every shard's pages, req slots, metadata
// slots (and state pools) are all free, that no room is left in any ledger,
// and that the ledgers' invariants hold.
func (h *harness) assertLedgersFull() {
	h.t.Helper()
	for i, l := range h.leds {
		s := l.Stats()
		for _, p := range []struct {
			name string
			rs   prealloc.ResourceStats
		}{{"pages", s.Pages}, {"req slots", s.ReqSlots}, {"metadata slots", s.MetaSlots}, {"mamba slots", s.MambaSlots}, {"swa pages", s.SWAPages}} {
			if p.rs.Free != p.rs.Total || p.rs.Used != 0 {
				h.t.Errorf("shard %d %s: %d of %d free (%d used), want all free", i, p.name, p.rs.Free, p.rs.Total, p.rs.Used)
			}
		}
		if n := s.Waiting + s.Ready + s.Admitted + s.Claimed + s.Resumed + s.Running + s.Retracted + s.Held; n != 0 {
			h.t.Errorf("shard %d still holds %d rooms: %+v", i, n, s)
		}
		if err := l.CheckInvariants(); err != nil {
			h.t.Errorf("shard %d invariants: %v", i, err)
		}
	}
	for _, hs := range h.m.Status().Holds { // the engine's pages (kv_pool.owner: engine)
		if hs.Queued+hs.Held+hs.Draining != 0 || hs.HeldPages+hs.DrainingPages != 0 {
			h.t.Errorf("shard %d hand-off ledger still holds: %+v", hs.Shard, hs)
		}
	}
}

// assertNoLiveRooms checks that every room the manager holds is terminal
// and has given back its resources.
func (h *harness) assertNoLiveRooms() {
	h.t.Helper()
	if n := h.m.InFlight(); n != 0 {
		live, _ := h.m.ListRooms(ListFilter{LiveOnly: true})
		var desc []string
		for _, s := range live {
			desc = append(desc, fmt.Sprintf("%d:%s", s.Room, s.Phase))
		}
		h.t.Errorf("InFlight() = %d, want 0: %s", n, strings.Join(desc, ", "))
	}
	h.m.lockAll()
	defer h.m.unlockAll()
	for id, e := range h.m.allRooms() {
		inflight := e.Inflight()
		if e.ReleasePending() || inflight != 0 || e.InLedger() {
			h.t.Errorf("room %d (%s): releasePending %v, inflight %d, inLedger %v; want all released", id, e.Phase(), e.ReleasePending(), inflight, e.InLedger())
		}
	}
}

// assertClean is the end of every failure-path test.
func (h *harness) assertClean() {
	h.t.Helper()
	h.assertNoLiveRooms()
	h.assertLedgersFull()
}

// pagesUsed is the pages in use on shard i.
func (h *harness) pagesUsed(i int) int64 { return h.stats(i).Pages.Used }

// nextEvent takes the next event of a claim; it must be queued.
func nextEvent(t *testing.T, c *Claim) (DestinationEvent, bool) {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		return ev, ok
	default:
		t.Fatalf("claim of room %d by %s: no event queued", c.room, c.rank)
	}
	return DestinationEvent{}, false
}

// gate is a fault hook that holds chunks in flight until released.
type gate struct {
	entered chan transfer.ChunkOp
	release chan error
	stop    chan struct{}
}

// newGate builds a gate; chunks still held when the test ends (a failed
// test) are let go with an error, so that the bubble can exit.
func newGate(t *testing.T) *gate {
	g := &gate{entered: make(chan transfer.ChunkOp, 16), release: make(chan error), stop: make(chan struct{})}
	t.Cleanup(func() { close(g.stop) })
	return g
}

// hook is installed with sim.SimEngine.SetFault: each chunk blocks until the
// test sends its outcome on release.
func (g *gate) hook(op transfer.ChunkOp) error {
	g.entered <- op
	select {
	case err := <-g.release:
		return err
	case <-g.stop:
		return errors.New("test ended with the chunk in flight")
	}
}

// smallPool sizes the decode pool in pages (64 tokens each).
func smallPool(pages int64) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		c.Pool.TotalTokens = 0
		c.Pool.TotalPages = pages
	}
}

// oneSlot leaves a single req_to_token row, so a second room stays queued
// (BlockReqSlots) while the first holds it.
func oneSlot(c *kvlayout.Config) {
	c.Pool.RequestSlots = 1
	c.Pool.PreAllocSlots = 0
}

// decodes combines decode-config adjustments.
func decodes(fs ...func(*kvlayout.Config)) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		for _, f := range fs {
			f(c)
		}
	}
}

// getRoom is GetRoom, failing the test on an error.
func (h *harness) getRoom(room uint64) RoomSnapshot { h.t.Helper(); return h.snapshot(room) }

// transferDup runs Transfer and returns its result and duplicate flag.
func transferDup(h *harness, req ChunkRequest) (transfer.ChunkResult, KVPoll, bool, error) {
	res, dup, err := h.m.Transfer(context.Background(), req)
	return res, h.m.Poll(req.Room), dup, err
}

// chunkWeight is what the layout says req's pages weigh (the bytes a
// ReportTransfer must carry), computed from the destination the rank got.
func (h *harness) chunkWeight(room uint64, req ChunkRequest) int64 {
	h.t.Helper()
	h.m.lockAll()
	defer h.m.unlockAll()
	d := h.m.allRooms()[room].Destination(req.Rank.Key())
	ps := d.PageSize
	tokens := min((req.PageOffset+req.NumPages)*ps, d.FillLen) - req.PageOffset*ps
	w := int64(max(tokens, 0)) * d.TokenBytes
	if req.Last {
		w += d.StateBytes
	}
	return w
}

// lockAll locks every shard, in order (tests only: they read room state;
// the manager itself never holds two shard locks).
func (m *Manager) lockAll() {
	for _, sh := range m.shards {
		sh.mu.Lock()
	}
}

func (m *Manager) unlockAll() {
	for _, sh := range m.shards {
		sh.mu.Unlock()
	}
}

// allRooms is every shard's rooms (lockAll held).
func (m *Manager) allRooms() map[uint64]*entry {
	out := map[uint64]*entry{}
	for _, sh := range m.shards {
		for id, e := range sh.rooms {
			out[id] = e
		}
	}
	return out
}

// dlLen is the number of entries on the deadline heap.
func (m *Manager) dlLen() int {
	m.dl.mu.Lock()
	defer m.dl.mu.Unlock()
	return len(m.dl.h)
}

// pendingCount is the number of claims waiting for rooms not opened yet.
func (m *Manager) pendingCount() int { return m.pend.len() }

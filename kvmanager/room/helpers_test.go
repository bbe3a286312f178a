package room

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/transfer"
)

type RankID = registry.RankID

const (
	addrA = "10.0.0.1:8998"
	addrB = "10.0.0.2:8998"
)

// The rooms of these tests live on a fixed clock: t0 is OpenRoom, and each
// step of the way to success has its own second, so that every deadline
// names the bound that set it.
var t0 = time.Unix(1_700_000_000, 0)

// sec is t0 plus n seconds.
func sec(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Second))) }

var (
	tOpen  = sec(0)
	tKnown = sec(1)
	tAdmit = sec(2)
	tClaim = sec(3)
	tLand  = sec(4)
	tDone  = sec(5) // success, retraction
	tEvent = sec(10)
)

const roomID = 7

// The settings of every room here, each a different length so that a
// deadline says which one set it.
const (
	bootstrapTimeout = 300 * time.Second
	dpTimeout        = 30 * time.Second
	waitingTimeout   = 60 * time.Second
	claimTimeout     = 20 * time.Second
	retractedTimeout = 100 * time.Second
	heldTimeout      = 200 * time.Second
	deferredTimeout  = 10 * time.Second
)

// destPages is the destination every admission here hands out (4 pages of
// the default layout's 64 tokens, 200 tokens filled, metadata slot 2).
var destPages = []int32{3, 4, 5, 6}

const (
	destFill = 200
	destSlot = 2
)

// prefillShape is a prefill instance's layout.
type prefillShape struct {
	tp, dp  int
	staging bool // the decode side has staging enabled (a staged plan needs tp != 1)
	lb      string
}

// rigOpt adjusts a rig before its room opens.
type rigOpt func(*rig)

// withTP2: the prefill has attention TP 2, so the decode rank needs both
// prefill ranks (two required ranks).
func withTP2(g *rig) { g.shape.tp = 2 }

// withDP2: the prefill has DP 2.
func withDP2(g *rig) { g.shape.dp = 2 }

// withStaging: TP 2 through the staging rings.
func withStaging(g *rig) { g.shape.tp, g.shape.staging = 2, true }

// withDeferred: release.deferred_timeout is set.
func withDeferred(g *rig) { g.cfg.DeferredTimeout = deferredTimeout }

// withParams adjusts the settings.
func withParams(f func(*Params)) rigOpt { return func(g *rig) { f(g.cfg) } }

// withHint opens the room with a router hint.
func withHint(dp int) rigOpt { return func(g *rig) { g.hint = dp } }

// rig is one room under test with its plan and settings. Every event is
// applied through apply, which checks what must hold after any event.
type rig struct {
	t       *testing.T
	r       *Room
	cfg     *Params
	shape   prefillShape
	hint    int
	timeout time.Duration // the request's time budget (withTimeout)
	plan    *registry.Plan
	topo    registry.PrefillTopology
	dp      int // the DP rank the room resolves to
	// scattersPending is what exec's success checks say of the staged
	// regions still to scatter (the staging handler's answer).
	scattersPending bool
}

func newRig(t *testing.T, opts ...rigOpt) *rig {
	t.Helper()
	g := &rig{t: t, r: &Room{}, hint: -1, shape: prefillShape{tp: 1, dp: 1},
		cfg: &Params{Layout: kvlayout.DefaultConfig().Layout(), Bootstrap: bootstrapTimeout, Waiting: waitingTimeout,
			DPRankResolution: dpTimeout, Retracted: retractedTimeout, Held: heldTimeout, ClaimTimeout: claimTimeout}}
	for _, o := range opts {
		o(g)
	}
	g.plan, g.topo = planOf(t, g.shape)
	g.cfg.Layout = layoutOf(g.shape)
	return g
}

func layoutOf(s prefillShape) kvlayout.Layout {
	dec := kvlayout.DefaultConfig()
	dec.Staging.Enabled = s.staging
	return dec.Layout()
}

// planOf is the complete plan of a prefill instance of shape s for the
// default decode layout, from a registry of its own: every rank registers
// (registry.New, Check, Record), then the instance's view is read.
func planOf(t *testing.T, s prefillShape) (*registry.Plan, registry.PrefillTopology) {
	t.Helper()
	dec := kvlayout.DefaultConfig()
	dec.Staging.Enabled = s.staging
	if err := dec.Validate(); err != nil {
		t.Fatalf("decode config: %v", err)
	}
	reg := registry.New(registry.Config{Layout: dec.Layout(), HeartbeatInterval: 5 * time.Second, MaxFailures: 2, BindingTTL: time.Minute,
		Now: func() time.Time { return t0 }})
	for dp := range s.dp {
		for tp := range s.tp {
			checked, err := reg.Check(registry.Registration{Addr: addrA, Endpoint: fmt.Sprintf("tcp://r-%d-%d", dp, tp), PageSize: dec.Pool.PageSize,
				KVDType: dec.Pool.DType, HTTPPort: 30000, LoadBalanceMethod: s.lb,
				Parallel: registry.ParallelInfo{AttnTP: s.tp, AttnTPRank: tp, AttnDP: s.dp, AttnDPRank: dp, AttnCP: 1, PP: 1, SystemDP: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := reg.Record(checked); err != nil {
				t.Fatal(err)
			}
		}
	}
	inst, ok := reg.Instance(addrA)
	if !ok || !inst.Complete || inst.Plan == nil {
		t.Fatalf("instance %s not complete", addrA)
	}
	if inst.Plan.Staging() != s.staging {
		t.Fatalf("plan staging %v, want %v", inst.Plan.Staging(), s.staging)
	}
	return inst.Plan, inst.Topology
}

// rank is the i-th required prefill rank of the plan on the room's DP rank.
func (g *rig) rank(i int) RankID {
	k := g.plan.Required()[i]
	return RankID{Addr: addrA, DP: g.dp, CP: k.CP, TP: k.TP, PP: k.PP}
}

// ranks are every required rank.
func (g *rig) ranks() []RankID {
	var out []RankID
	for i := range g.plan.Required() {
		out = append(out, g.rank(i))
	}
	return out
}

// The steps of a room's way, each applied through apply, each checked to
// land where it must.

func (g *rig) open() {
	g.t.Helper()
	g.want(g.apply(Open{Now: tOpen, ID: roomID, Addr: addrA, DecodeDP: 0, HintDP: g.hint, Params: g.cfg, Timeout: g.timeout,
		Request: Request{RID: "rid-7", PromptLen: 150, OutputLen: 0, MaxNewTokens: 50, Priority: 1}}), PhaseWaitingPrefill)
}

// known: the prefill's registration completed and its rules resolved DP
// rank dp.
func (g *rig) known(dp int) {
	g.t.Helper()
	g.dp = dp
	g.want(g.apply(PrefillKnown{Now: tKnown, Plan: g.plan, Topology: g.topo, Resolved: true, DP: dp, Rule: registry.DPRuleSingleDP}), PhaseQueued)
}

// resolving: the prefill's registration completed and no rule resolved the
// DP rank.
func (g *rig) resolving() {
	g.t.Helper()
	g.want(g.apply(PrefillKnown{Now: tKnown, Plan: g.plan, Topology: g.topo}), PhaseResolvingDP)
}

// admit hands the room its destination (staged when the plan is).
func (g *rig) admit() {
	g.t.Helper()
	g.want(g.apply(Admitted{Now: tAdmit, Pages: destPages, FillLen: destFill, MetadataSlot: destSlot, Staged: g.plan.Staging()}), PhaseAdmitted)
}

// claimAll: every required rank's claim stream attached and delivered the
// destination.
func (g *rig) claimAll() {
	g.t.Helper()
	for _, rk := range g.ranks() {
		g.attach(rk)
	}
	for _, rk := range g.ranks() {
		g.exec(Delivered{Now: tClaim, Rank: rk.Key(), Attempt: g.r.Attempt()})
	}
	g.want(Effects{}, PhaseClaimed)
}

func (g *rig) attach(rk RankID) {
	g.t.Helper()
	if e := g.apply(Attach{Rank: rk, Registered: true}); e.Err != nil || e.Reply != nil {
		g.t.Fatalf("attach %s: %v %+v", rk, e.Err, e.Reply)
	}
}

// chunk is chunk index of rank rk: chunk 0 is pages [0, 2), chunk 1 pages
// [2, 4), the last, with the room marker.
func (g *rig) chunk(rk RankID, index int) ChunkRequest {
	req := ChunkRequest{Room: roomID, Rank: rk, Index: index, PageOffset: 2 * index, NumPages: 2, Attempt: g.r.Attempt()}
	if index == 1 {
		req.Last, req.Marker = true, roomID
	}
	return req
}

// chunkBytes is what each landed chunk reports.
const chunkBytes = 1000

// land moves chunk index of rank rk through the daemon's engine: begun,
// then landed (the last writes marker); the success check follows as the
// executor runs it.
func (g *rig) land(rk RankID, index int, marker uint64) Effects {
	g.t.Helper()
	req := g.chunk(rk, index)
	if b := g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine}); b.Err != nil || !b.Begin.Fresh {
		g.t.Fatalf("begin chunk %d of %s: %v %+v", index, rk, b.Err, b.Begin)
	}
	return g.exec(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: transfer.ChunkResult{Bytes: chunkBytes, MarkerWritten: marker}})
}

// landAll lands both chunks of every rank, the last with marker.
func (g *rig) landAll(marker uint64) {
	g.t.Helper()
	for _, rk := range g.ranks() {
		g.land(rk, 0, 0)
		g.land(rk, 1, marker)
	}
}

// succeed walks an admitted room to Succeeded.
func (g *rig) succeed() {
	g.t.Helper()
	g.claimAll()
	g.landAll(roomID)
	g.want(Effects{}, PhaseSucceeded)
}

// exec applies ev and the steps its effects ask for, as the shard does
// (shard.exec), at the event's time; it returns ev's own effects.
func (g *rig) exec(ev Event) Effects {
	g.t.Helper()
	first := g.apply(ev)
	now := eventTime(ev)
	for then := first.Then; then != ThenNone; {
		var next Effects
		switch then {
		case ThenTransferring:
			next = g.apply(Transferring{Now: now})
		case ThenCheckSuccess:
			next = g.apply(CheckSuccess{Now: now, ScattersPending: g.scattersPending})
		}
		then = next.Then
	}
	return first
}

// want fails the test unless the room is in phase p (e is for the message).
func (g *rig) want(e Effects, p Phase) {
	g.t.Helper()
	if g.r.Phase() != p {
		g.t.Fatalf("room in phase %s, want %s (effects %+v; err %v; failure %+v)", g.r.Phase(), p, e.Move, e.Err, g.r.Failure())
	}
}

// eventTime is the event's Now (zero for an event without one).
func eventTime(ev Event) time.Time {
	v := reflect.ValueOf(ev)
	if f := v.FieldByName("Now"); f.IsValid() {
		return f.Interface().(time.Time)
	}
	return time.Time{}
}

// apply applies ev and checks what holds after any event: a move is the
// room's phase change and its last recorded transition, with the label,
// note, time and attempt it reports; a failure is the room's, ends its
// claims with itself and is recorded with its code's label; a release gives
// everything back; and an event refused without a move changes nothing the
// room shows.
func (g *rig) apply(ev Event) Effects {
	g.t.Helper()
	r := g.r
	before, phase := observe(r), r.Phase()
	e := r.Apply(ev)
	if m := e.Move; m.Moved {
		last := r.lastStep()
		pub := m.Step.Public(r.Addr(), r.Texts())
		switch {
		case m.From != phase || m.To != r.Phase() || m.Step.Phase() != m.To:
			g.t.Errorf("%T: move %s -> %s (step %s), room was %s and is %s", ev, m.From, m.To, m.Step.Phase(), phase, r.Phase())
		case last != m.Step.t:
			g.t.Errorf("%T: the room's last transition %+v is not the move's %+v", ev, last, m.Step.t)
		case pub.SGLang != m.SGLang || pub.Note != m.Note(r.Addr()) || pub.Attempt != r.Attempt() || pub.Phase != m.To || pub.Poll != m.To.Poll():
			g.t.Errorf("%T: the timeline renders %+v, the move says %s %q (attempt %d)", ev, pub, m.SGLang, m.Note(r.Addr()), r.Attempt())
		case !eventTime(ev).IsZero() && !pub.At.Equal(eventTime(ev)):
			g.t.Errorf("%T: the move is recorded at %v, the event's time is %v", ev, pub.At, eventTime(ev))
		}
	} else if m != (Move{}) || r.Phase() != phase {
		g.t.Errorf("%T: no move, but move %+v and the room went %s -> %s", ev, m, phase, r.Phase())
	}
	if f := e.Failure; f != nil {
		switch {
		case r.Failure() == nil || *r.Failure() != *f:
			g.t.Errorf("%T: failure %+v, the room's %+v", ev, *f, r.Failure())
		case !e.EndClaims || e.ClaimEnd.Failure != f || e.ClaimEnd.Done != nil:
			g.t.Errorf("%T: failure %+v, claims end %v with %+v", ev, *f, e.EndClaims, e.ClaimEnd)
		case e.Move.To != PhaseFailed || e.Move.SGLang != sglangFor[f.Code] || e.Move.Note(r.Addr()) != f.Message:
			g.t.Errorf("%T: failure %s recorded as %s -> %s %q %q", ev, f.Code, e.Move.From, e.Move.To, e.Move.SGLang, e.Move.Note(r.Addr()))
		}
	}
	if e.Release && (r.ReleasePending() || r.InLedger() || r.Gated()) {
		g.t.Errorf("%T: released, but pending %v, in ledger %v, gated %v", ev, r.ReleasePending(), r.InLedger(), r.Gated())
	}
	if e.Err != nil && !e.Move.Moved {
		switch ev.(type) {
		case ChunkEnd, ScatterEnd, StagingWrite: // they settle what ran, or record the claim the write proves
		default:
			if after := observe(r); after != before {
				g.t.Errorf("%T refused (%v), but the room changed:\n before %s\n after  %s", ev, e.Err, before, after)
			}
		}
	}
	return e
}

// observe renders everything a room shows and decides with: its snapshot
// with timeline and pages, coverage, deadline, attached ranks, drain,
// release and gates, and per rank what was sent, landed and claimed.
func observe(r *Room) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%+v cov %+v next %v ranks %v draining %v %q pending %v ledger %v inflight %v gated %v idem %q",
		r.Snapshot(true, true), r.Coverage(), r.NextDeadline(), sortedRanks(r.Ranks()), r.Draining(), r.DrainWaiting(),
		r.ReleasePending(), r.InLedger(), r.Inflight(), r.Gated(), r.IdempotencyKey())
	if h := r.handoff; h != nil {
		fmt.Fprintf(&b, " claimed %d done %d marker %d quarantine %d claimBy %d stagingBy %d", h.claimedN, h.doneN, h.marker, h.quarantine, h.claimBy, h.stagingBy)
		h.ranks.eachKey(func(k registry.RankKey, rp *rankProgress) {
			if rp.claimed || rp.cov.nSent > 0 || len(rp.chunks) > 0 || rp.last >= 0 || rp.stagingOpen > 0 || rp.engine {
				fmt.Fprintf(&b, " %+v{claimed %v sent %d landed %d last %d chunks %d staging %d engine %v}", k, rp.claimed, rp.cov.nSent, rp.cov.landed, rp.last, len(rp.chunks), rp.stagingOpen, rp.engine)
			}
		})
	}
	return b.String()
}

func sortedRanks(rs []RankID) []RankID {
	slices.SortFunc(rs, func(a, b RankID) int { return strings.Compare(a.String(), b.String()) })
	return rs
}

// state builds a room in a given state; its phase and deadline are asserted
// before each row's event (so that every row says where it starts from).
type state struct {
	name  string
	build func(*rig)
	opts  []rigOpt
	phase Phase
	next  string
}

// row is one event applied to a room in a state.
type row struct {
	name  string
	from  state
	opts  []rigOpt         // more options of the rig
	prep  func(*rig)       // more steps after the state's
	ev    func(*rig) Event // the event under test
	want  eff
	says  []string                        // text(e) contains each
	check func(*testing.T, *rig, Effects) // what else the row proves
}

// run runs rows as subtests.
func run(t *testing.T, rows []row) {
	t.Helper()
	for _, c := range rows {
		t.Run(c.name, func(t *testing.T) {
			g := newRig(t, append(slices.Clip(c.from.opts), c.opts...)...)
			c.from.build(g)
			if g.r.Phase() != c.from.phase || since(g.r.NextDeadline()) != c.from.next {
				t.Fatalf("state %s: phase %s, deadline %q; want %s, %q", c.from.name, g.r.Phase(), since(g.r.NextDeadline()), c.from.phase, c.from.next)
			}
			if c.prep != nil {
				c.prep(g)
			}
			e := g.apply(c.ev(g))
			if d := diff(digest(g.r, e), c.want); d != "" {
				t.Errorf("from %s:\n\t%s", c.from.name, d)
			}
			for _, s := range c.says {
				if !strings.Contains(text(e), s) {
					t.Errorf("says %q, want it to contain %q", text(e), s)
				}
			}
			if c.check != nil {
				c.check(t, g, e)
			}
		})
	}
}

// The states rows start from. Each names the phase and the deadline its
// room is at; the times are those of the steps above (tOpen, tKnown, ...).
var (
	stWaitingPrefill = state{name: "waiting_prefill", build: func(g *rig) { g.open() }, phase: PhaseWaitingPrefill, next: "5m0s"}
	stResolving      = state{name: "resolving_dp_rank", opts: []rigOpt{withDP2}, build: func(g *rig) { g.open(); g.resolving() }, phase: PhaseResolvingDP, next: "31s"}
	stQueued         = state{name: "queued", build: func(g *rig) { g.open(); g.known(0) }, phase: PhaseQueued, next: "5m0s"}
	stAdmitted       = state{name: "admitted", build: func(g *rig) { g.open(); g.known(0); g.admit() }, phase: PhaseAdmitted, next: "22s"}
	stClaimed        = state{name: "claimed", build: func(g *rig) { g.open(); g.known(0); g.admit(); g.claimAll() }, phase: PhaseClaimed, next: "1m3s"}
	// transferring: chunk 0 of every rank landed.
	stTransferring = state{name: "transferring", build: func(g *rig) {
		g.open()
		g.known(0)
		g.admit()
		g.claimAll()
		for _, rk := range g.ranks() {
			g.land(rk, 0, 0)
		}
	}, phase: PhaseTransferring, next: "1m3s"}
	// landedNoMarker: every chunk landed and the metadata slot holds no
	// marker yet.
	stLandedNoMarker = state{name: "transferring, every chunk landed, no marker", build: func(g *rig) {
		g.open()
		g.known(0)
		g.admit()
		g.claimAll()
		g.landAll(0)
	}, phase: PhaseTransferring, next: "1m3s"}
	stSucceeded = state{name: "succeeded", build: func(g *rig) { g.open(); g.known(0); g.admit(); g.succeed() }, phase: PhaseSucceeded}
	stReleased  = state{name: "released", build: func(g *rig) {
		stSucceeded.build(g)
		g.apply(Release{Now: tDone, Why: "released by the decode engine"})
	}, phase: PhaseReleased}
	stFailed = state{name: "failed", build: func(g *rig) {
		g.open()
		g.known(0)
		g.admit()
		g.apply(Fail{Now: tDone, Failure: Failure{Code: FailureAborted, Message: "Aborted by AbortReq."}})
	}, phase: PhaseFailed}
	stRetracted = state{name: "retracted", build: func(g *rig) {
		stSucceeded.build(g)
		g.apply(Retract{Now: tDone})
	}, phase: PhaseRetracted, next: "1m45s"}
	stHeld = state{name: "held", build: func(g *rig) {
		stSucceeded.build(g)
		g.apply(Retract{Now: tDone, Held: true})
	}, phase: PhaseHeld, next: "3m25s"}
	// rebootstrapped: a held room's second attempt, waiting for its prefill
	// again (bounded by timeouts.bootstrap from tEvent-1s).
	stRebootstrapped = state{name: "rebootstrapped", build: func(g *rig) {
		stHeld.build(g)
		g.apply(Rebootstrap{Now: sec(9)})
	}, phase: PhaseWaitingPrefill, next: "5m9s"}
	// requeued: the second attempt queued on its pinned DP rank.
	stRequeued = state{name: "rebootstrapped, queued", build: func(g *rig) {
		stRebootstrapped.build(g)
		g.want(g.apply(PrefillKnown{Now: sec(9), Plan: g.plan, Topology: g.topo}), PhaseQueued)
	}, phase: PhaseQueued, next: "5m9s"}
	// readmitted: the second attempt admitted (claim timeout from 9 s).
	stReadmitted = state{name: "rebootstrapped, admitted", build: func(g *rig) {
		stRequeued.build(g)
		g.want(g.apply(Admitted{Now: sec(9), Pages: []int32{11, 12, 13, 14}, FillLen: destFill, MetadataSlot: 5}), PhaseAdmitted)
	}, phase: PhaseAdmitted, next: "29s"}
	stAdopted = state{name: "adopted", build: func(g *rig) {
		g.apply(Adopt{Now: tOpen, ID: roomID, Addr: addrA, DecodeDP: 0, PrefillDP: 0, Params: g.cfg, Request: Request{RID: "rid-7", PromptLen: 150, OutputLen: 20},
			ReqSlot: 9, Pages: destPages, FillLen: 170})
	}, phase: PhaseSucceeded}
)

// with is s built on a rig with more options (a new name says which).
func (s state) with(name string, opts ...rigOpt) state {
	s.name += ", " + name
	s.opts = append(slices.Clip(s.opts), opts...)
	return s
}

// at is s with another expected deadline (its options change the bounds).
func (s state) at(next string) state {
	s.next = next
	return s
}

func itoa(n int) string { return strconv.Itoa(n) }

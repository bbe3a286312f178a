package room

import (
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
)

// The handshake: OpenRoom (T1), the prefill's registration and its DP rank
// (T2/T4/T8, or ResolvingDP until a BindRoom), and the failures on the way.

var stZero = state{name: "zero room", build: func(*rig) {}, phase: PhaseUnspecified}

func TestOpen(t *testing.T) {
	open := func(hint int, rid, idem string) func(*rig) Event {
		return func(g *rig) Event {
			return Open{Now: tEvent, ID: 9, Addr: addrA, DecodeDP: 1, HintDP: hint, IdempotencyKey: idem, Params: g.cfg,
				Request: Request{RID: rid, PromptLen: 150, OutputLen: 3, MaxNewTokens: 50, Priority: 2, Rebootstrap: true}}
		}
	}
	opened := eff{Move: "unspecified -> waiting_prefill T1", Note: "opened on decode shard 1", Phase: PhaseWaitingPrefill, Next: "5m10s"}
	identity := func(hint int, name, idem string) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			r := g.r
			if r.ID() != 9 || r.Addr() != addrA || r.DecodeDP() != 1 || r.HintDP() != hint || r.PrefillDP() != -1 || r.Attempt() != 1 ||
				r.MetadataSlot() != -1 || !r.InLedger() || r.Pages() != nil || r.Plan() != nil || !r.OpenedAt().Equal(tEvent) || !r.UpdatedAt().Equal(tEvent) {
				t.Errorf("opened room: %+v", r.Snapshot(false, false))
			}
			if r.RequestName() != name || r.IdempotencyKey() != idem || r.Request() != (Request{RID: r.Request().RID, PromptLen: 150, OutputLen: 3, MaxNewTokens: 50, Priority: 2, Rebootstrap: true}) {
				t.Errorf("request %+v named %q, idempotency key %q", r.Request(), r.RequestName(), r.IdempotencyKey())
			}
			if tl := r.Snapshot(true, false).Transitions; len(tl) != 1 || tl[0].SGLang != "T1" || tl[0].Note != "opened on decode shard 1" || !tl[0].At.Equal(tEvent) {
				t.Errorf("timeline %+v, want OpenRoom's T1 alone", tl)
			}
		}
	}
	run(t, []row{
		{name: "T1 without a hint", from: stZero, ev: open(-1, "rid-9", ""), want: opened, check: identity(-1, "rid-9", "")},
		{name: "T1 with a hint and an idempotency key", from: stZero, ev: open(1, "rid-9", "key"), want: opened, check: identity(1, "rid-9", "key")},
		{name: "T1 without a rid is named by its room", from: stZero, ev: open(-1, "", ""), want: opened, check: identity(-1, "9", "")},
	})
}

// rebootstrapOn walks a room of the rig's prefill to its second attempt
// resolved to DP rank dp at first: succeeded, held, ContinueGeneration.
func (g *rig) rebootstrapOn(dp int) {
	g.t.Helper()
	g.open()
	g.known(dp)
	g.admit()
	g.succeed()
	g.apply(Retract{Now: tDone, Held: true})
	g.want(g.apply(Rebootstrap{Now: sec(9)}), PhaseWaitingPrefill)
}

func TestPrefillKnown(t *testing.T) {
	known := func(resolved bool, dp int, rule registry.DPRule) func(*rig) Event {
		return func(g *rig) Event {
			return PrefillKnown{Now: tEvent, Plan: g.plan, Topology: g.topo, Resolved: resolved, DP: dp, Rule: rule}
		}
	}
	queuedOn := func(dp int, rule registry.DPRule, next string) eff {
		return eff{Move: "waiting_prefill -> queued T2/T4/T8", Note: "prefill dp rank " + itoa(dp) + " (" + rule.String() + ")", Unwait: true,
			Resolved: "dp " + itoa(dp) + " " + rule.String(), Ledger: "ready", AdmitNow: true, Phase: PhaseQueued, Next: next}
	}
	planKept := func(dp int, rule registry.DPRule) func(*testing.T, *rig, Effects) {
		return func(t *testing.T, g *rig, _ Effects) {
			if g.r.Plan() != g.plan || g.r.PrefillDP() != dp || g.r.Snapshot(false, false).DPRule != rule || g.r.Staging() != g.plan.Staging() {
				t.Errorf("plan %p (want %p), dp %d (%s), staging %v", g.r.Plan(), g.plan, g.r.PrefillDP(), g.r.Snapshot(false, false).DPRule, g.r.Staging())
			}
		}
	}
	const outOfRange = "disagg_prefill_dp_rank 2 is out of range for 10.0.0.1:8998 (dp_size 2)"
	failed := eff{Move: "waiting_prefill -> failed ", Note: outOfRange, Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure dp_rank_unresolved",
		Failure: "dp_rank_unresolved", Finished: "failed dp_rank_unresolved", SinceOpen: 10e9, Ledger: "release", End: true, Release: true, Phase: PhaseFailed}
	run(t, []row{
		{name: "T2/T4/T8 single_dp", from: stWaitingPrefill, ev: known(true, 0, registry.DPRuleSingleDP),
			want: queuedOn(0, registry.DPRuleSingleDP, "5m0s"), check: planKept(0, registry.DPRuleSingleDP)},
		{name: "T2/T4/T8 follow_room on DP 2", from: stWaitingPrefill.with("dp 2", withDP2), ev: known(true, 1, registry.DPRuleFollowRoom),
			want: queuedOn(1, registry.DPRuleFollowRoom, "5m0s"), check: planKept(1, registry.DPRuleFollowRoom)},
		{name: "T2/T4/T8 by the router's hint", from: stWaitingPrefill.with("dp 2, hint 1", withDP2, withHint(1)),
			prep: func(g *rig) {
				if !g.r.NeedsDPRule(2) {
					g.t.Error("a room with an in-range hint does not ask the rules")
				}
			},
			ev: known(true, 1, registry.DPRuleHint), want: queuedOn(1, registry.DPRuleHint, "5m0s")},
		{name: "staged plan", from: stWaitingPrefill.with("staged", withStaging), ev: known(true, 0, registry.DPRuleSingleDP),
			want: queuedOn(0, registry.DPRuleSingleDP, "5m0s"), check: planKept(0, registry.DPRuleSingleDP)},
		{name: "no rule resolves: ResolvingDP bounded by timeouts.dp_rank_resolution", from: stWaitingPrefill.with("dp 2", withDP2), ev: known(false, 0, 0),
			want: eff{Move: "waiting_prefill -> resolving_dp_rank ", Note: addrA + ": dp_size 2, follow_bootstrap_room true: waiting for BindRoom", Unwait: true,
				Phase: PhaseResolvingDP, Next: "40s"},
			check: planKept(-1, registry.DPRuleNone)},
		{name: "the DP bound after timeouts.bootstrap leaves the bootstrap bound", from: stWaitingPrefill.with("dp 2, slow resolution", withDP2,
			withParams(func(p *Params) { p.DPRankResolution = time.Hour })), ev: known(false, 0, 0),
			want: eff{Move: "waiting_prefill -> resolving_dp_rank ", Note: addrA + ": dp_size 2, follow_bootstrap_room true: waiting for BindRoom", Unwait: true,
				Phase: PhaseResolvingDP, Next: "5m0s"}},
		{name: "hint out of range fails", from: stWaitingPrefill.with("dp 2, hint 2", withDP2, withHint(2)),
			prep: func(g *rig) {
				if g.r.NeedsDPRule(2) {
					g.t.Error("a room with an out-of-range hint asks the rules")
				}
			},
			ev: known(false, 0, 0), want: failed, says: []string{outOfRange}},
		{name: "attached claims of another DP rank are refused at resolution", from: stWaitingPrefill.with("dp 2, tp 2", withDP2, withTP2),
			prep: func(g *rig) {
				g.attach(RankID{Addr: addrA, DP: 0, TP: 0})
				g.attach(RankID{Addr: addrA, DP: 1, TP: 1})
			},
			ev: known(true, 1, registry.DPRuleFollowRoom),
			want: func() eff {
				w := queuedOn(1, registry.DPRuleFollowRoom, "5m0s")
				w.Refuse = "{CP:0 TP:0 PP:0} failure dp_rank_conflict"
				return w
			}(),
			check: func(t *testing.T, g *rig, e Effects) {
				if msg := e.Refuse[0].Event.Failure.Message; msg != "rank "+(RankID{Addr: addrA}).String()+" is not a source of room 7: the room's prefill DP rank is 1 (follow_room)" {
					t.Errorf("refusal %q", msg)
				}
				if rs := g.r.Ranks(); len(rs) != 1 || rs[0] != (RankID{Addr: addrA, DP: 1, TP: 1}) {
					t.Errorf("attached after the resolution: %v, want DP 1's rank alone", rs)
				}
			}},
		{name: "a queued room ignores it", from: stQueued, ev: known(true, 0, registry.DPRuleSingleDP), want: eff{Phase: PhaseQueued, Next: "5m0s"}},
		{name: "a rebootstrap stays on its pinned DP rank with its rule", from: stRebootstrapped,
			prep: func(g *rig) {
				if g.r.NeedsDPRule(1) {
					g.t.Error("a pinned room asks the rules")
				}
			},
			ev: known(false, 0, 0), want: queuedOn(0, registry.DPRuleSingleDP, "5m9s"),
			check: func(t *testing.T, g *rig, _ Effects) {
				if h := g.r.handoff; h.ranks != nil || h.claimedN != 0 || h.doneN != 0 {
					t.Errorf("the new attempt kept the previous attempt's rank progress: ranks %v, claimed %d, done %d", h.ranks != nil, h.claimedN, h.doneN)
				}
			}},
		{name: "a rebootstrap's pinned DP rank 1 of a DP 2 prefill", from: stZero, opts: []rigOpt{withDP2},
			prep: func(g *rig) { g.rebootstrapOn(1) },
			ev:   known(true, 0, registry.DPRuleFollowRoom), want: queuedOn(1, registry.DPRuleSingleDP, "5m9s")},
		{name: "a rebootstrap's pinned DP rank no longer exists", from: stZero, opts: []rigOpt{withDP2},
			prep: func(g *rig) {
				g.rebootstrapOn(1)
				g.plan, g.topo = planOf(g.t, prefillShape{tp: 1, dp: 1}) // the prefill came back with dp_size 1
			},
			ev: known(true, 0, registry.DPRuleSingleDP),
			want: eff{Move: "waiting_prefill -> failed ", Note: "rebootstrap of room 7: its prefill DP rank 1 no longer exists at 10.0.0.1:8998 (dp_size is now 1)",
				Unwait: true, Cancel: true, EndClaims: true, ClaimEnd: "failure dp_rank_unresolved", Failure: "dp_rank_unresolved", Finished: "failed dp_rank_unresolved",
				SinceOpen: 10e9, Ledger: "release", End: true, Release: true, Phase: PhaseFailed}},
	})
}

func TestBound(t *testing.T) {
	bound := func(addr string, dp int, selfWriter bool) func(*rig) Event {
		return func(*rig) Event { return Bound{Now: tEvent, Addr: addr, DP: dp, SelfWriter: selfWriter} }
	}
	const conflict = "prefill DP rank 1 reported holding room 7, but the room was resolved to dp_rank 0 (single_dp); the destination would go to the wrong ranks"
	failed := func(from Phase) eff {
		return eff{Err: "dp_rank_conflict", Move: from.String() + " -> failed ", Note: conflict, Unwait: true, Cancel: true, EndClaims: true,
			ClaimEnd: "failure dp_rank_conflict", Failure: "dp_rank_conflict", Finished: "failed dp_rank_conflict", SinceOpen: 10e9,
			Ledger: "release", End: true, Release: true, Phase: PhaseFailed}
	}
	run(t, []row{
		{name: "T2/T4/T8 by BindRoom", from: stResolving, ev: bound(addrA, 1, false),
			want: eff{Move: "resolving_dp_rank -> queued T2/T4/T8", Note: "prefill dp rank 1 (binding)", Resolved: "dp 1 binding", Ledger: "ready", AdmitNow: true,
				Phase: PhaseQueued, Next: "5m0s"}},
		{name: "BindRoom refuses attached claims of the other DP rank", from: stResolving.with("tp 2", withTP2),
			prep: func(g *rig) {
				g.attach(RankID{Addr: addrA, DP: 0, TP: 0})
				g.attach(RankID{Addr: addrA, DP: 1, TP: 1})
			},
			ev: bound(addrA, 0, false),
			want: eff{Move: "resolving_dp_rank -> queued T2/T4/T8", Note: "prefill dp rank 0 (binding)", Resolved: "dp 0 binding", Ledger: "ready", AdmitNow: true,
				Refuse: "{CP:0 TP:1 PP:0} failure dp_rank_conflict", Phase: PhaseQueued, Next: "5m0s"},
			check: func(t *testing.T, g *rig, e Effects) {
				if rs := g.r.Ranks(); len(rs) != 1 || rs[0] != (RankID{Addr: addrA, DP: 0, TP: 0}) {
					t.Errorf("attached: %v", rs)
				}
				if e.Refuse[0].Event.Failure.Message != "rank "+(RankID{Addr: addrA, DP: 1, TP: 1}).String()+" is not a source of room 7: the room's prefill DP rank is 0 (binding)" {
					t.Errorf("refusal %q", e.Refuse[0].Event.Failure.Message)
				}
			}},
		{name: "another address's binding is ignored", from: stResolving, ev: bound(addrB, 1, false), want: eff{Phase: PhaseResolvingDP, Next: "31s"}},
		{name: "a binding before the prefill is known is ignored", from: stWaitingPrefill, ev: bound(addrA, 0, false), want: eff{Phase: PhaseWaitingPrefill, Next: "5m0s"}},
		{name: "the same DP rank again is accepted", from: stQueued, ev: bound(addrA, 0, false), want: eff{Phase: PhaseQueued, Next: "5m0s"}},
		{name: "another DP rank fails a queued room", from: stQueued.with("dp 2", withDP2), ev: bound(addrA, 1, false), want: failed(PhaseQueued), says: []string{conflict}},
		{name: "another DP rank fails a transferring room", from: stTransferring.with("dp 2", withDP2), ev: bound(addrA, 1, false),
			want: func() eff { w := failed(PhaseTransferring); w.SinceOpen = 10e9; return w }()},
		{name: "another DP rank fails an admitted room whose attached rank writes by itself: it owes an ack",
			from: stAdmitted.with("dp 2, deferred", withDP2, withDeferred),
			prep: func(g *rig) { g.attach(g.rank(0)) },
			ev:   bound(addrA, 1, true),
			want: eff{Err: "dp_rank_conflict", Move: "admitted -> failed ", Note: conflict, Unwait: true, Cancel: true, EndClaims: true,
				ClaimEnd: "failure dp_rank_conflict", Owing: "[cp 0 tp 0 pp 0]", Failure: "dp_rank_conflict", Finished: "failed dp_rank_conflict", SinceOpen: 10e9,
				Ledger: "drain", End: true, Drain: "started: attempt 1 ranks [cp 0 tp 0 pp 0] until 20s acks 0", Phase: PhaseFailed, Next: "20s"}},
		{name: "a running room ignores it", from: stSucceeded.with("dp 2", withDP2), ev: bound(addrA, 1, false), want: eff{Phase: PhaseSucceeded}},
	})
}

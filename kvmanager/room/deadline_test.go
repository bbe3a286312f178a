package room

import (
	"testing"
	"time"
)

// Deadlines: each bound fails the room with its code and a message naming
// its setting, at its deadline and not a nanosecond before; an ended room's
// drain and quarantine give its resources back when they pass.

// timedOut is a failure from phase p at n seconds after OpenRoom.
func timedOut(p Phase, label string, c FailureCode, msg string, n float64) eff {
	w := failedFrom(p, label, c, msg)
	w.SinceOpen = time.Duration(n * float64(time.Second))
	return w
}

func deadlineAt(n float64, edit func(*Deadline)) func(*rig) Event {
	return func(*rig) Event {
		d := Deadline{Now: sec(n)}
		if edit != nil {
			edit(&d)
		}
		return d
	}
}

// justBefore is a deadline a nanosecond before n seconds.
func justBefore(n float64) func(*rig) Event {
	return func(*rig) Event { return Deadline{Now: sec(n).Add(-time.Nanosecond)} }
}

func TestDeadline(t *testing.T) {
	const (
		recompute   = "; rebootstrap attempt 2: the prefill sends only after the decode engine's recompute request (POST http://10.0.0.1:30000/generate, pinned to prefill DP rank 0, from ContinueGeneration's answer)"
		noHTTP      = "; rebootstrap attempt 2: the prefill sends only after the decode engine's recompute request (POST the prefill's /generate (10.0.0.1:8998 registered no prefill_http_port), pinned to prefill DP rank 0, from ContinueGeneration's answer)"
		bootWaiting = "Request 7 timed out after 300.0s in KVPoll.Bootstrapping: the destination was not claimed within timeouts.bootstrap (phase waiting_prefill)"
		dpMsg       = "Request 7 timed out after 31.0s in KVPoll.Bootstrapping: no rule resolved its prefill DP rank at 10.0.0.1:8998 within timeouts.dp_rank_resolution (no router hint, prefill dp_size 2, follow_bootstrap_room true, no BindRoom received)"
		claimMsg    = "Request 7 timed out after 20.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 0 pp 0) within admission.claim_timeout"
		waitingMsg  = "Request 7 timed out after 60.0s in KVPoll.WaitingForInput (prefill ranks still sending: cp 0 tp 0 pp 0)"
	)
	withURL := func(d *Deadline) { d.GenerateURL = "http://10.0.0.1:30000/generate" }
	quiet := func(from state) eff { return eff{Phase: from.phase, Next: from.next} }
	slowClaims := withParams(func(p *Params) { p.ClaimTimeout = 400 * time.Second })
	// stStaged: every rank of a staged room reported its chunks at 4 s with
	// scatters pending: the completion timeout runs until 64 s.
	stStaged := state{name: "staged, every rank reported", opts: []rigOpt{withStaging}, build: func(g *rig) {
		stClaimed.build(g)
		g.scattersPending = true
		g.landAll(roomID)
	}, phase: PhaseTransferring, next: "1m4s"}
	// quarantined: a claimed room whose chunk failed at 5 s with writes that
	// may continue until 30 s.
	quarantined := state{name: "quarantined", build: func(g *rig) {
		stClaimed.build(g)
		started(0)(g)
		g.apply(ChunkEnd{Now: tDone, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30)})
	}, phase: PhaseFailed, next: "30s"}
	// drainingQuarantined: rank 1 owes an ack until 15 s, rank 0's failed
	// chunk may write until 30 s.
	drainingQuarantined := state{name: "draining and quarantined", opts: []rigOpt{withTP2, withDeferred}, build: func(g *rig) {
		stClaimed.build(g)
		started(0)(g)
		g.apply(ChunkEnd{Now: tDone, Req: g.chunk(g.rank(0), 0), Via: ViaEngine, Err: errBoom, WritesUntil: sec(30), SelfWriter: true})
	}, phase: PhaseFailed, next: "15s"}
	run(t, []row{
		{name: "timeouts.bootstrap while waiting for the prefill", from: stWaitingPrefill, ev: deadlineAt(300, nil),
			want: timedOut(PhaseWaitingPrefill, "", FailureBootstrapTimeout, bootWaiting, 300), says: []string{bootWaiting}},
		{name: "not yet", from: stWaitingPrefill, ev: justBefore(300), want: quiet(stWaitingPrefill)},
		{name: "timeouts.dp_rank_resolution", from: stResolving, ev: deadlineAt(31, nil),
			want: timedOut(PhaseResolvingDP, "", FailureDPRankUnresolved, dpMsg, 31), says: []string{dpMsg}},
		{name: "timeouts.dp_rank_resolution not yet", from: stResolving, ev: justBefore(31), want: quiet(stResolving)},
		{name: "timeouts.bootstrap before the DP bound", from: stResolving.with("slow resolution", withParams(func(p *Params) { p.DPRankResolution = time.Hour })).at("5m0s"),
			ev: deadlineAt(300, nil),
			want: timedOut(PhaseResolvingDP, "", FailureBootstrapTimeout,
				"Request 7 timed out after 300.0s in KVPoll.Bootstrapping: the destination was not claimed within timeouts.bootstrap (phase resolving_dp_rank)", 300)},
		{name: "timeouts.bootstrap while queued", from: stQueued, ev: deadlineAt(300, nil),
			want: timedOut(PhaseQueued, "", FailureBootstrapTimeout,
				"Request 7 timed out after 300.0s in KVPoll.WaitingForInput: the destination was not claimed within timeouts.bootstrap (phase queued)", 300)},
		{name: "admission.claim_timeout", from: stAdmitted, ev: deadlineAt(22, nil),
			want: timedOut(PhaseAdmitted, "", FailureClaimTimeout, claimMsg, 22), says: []string{claimMsg}},
		{name: "admission.claim_timeout not yet", from: stAdmitted, ev: justBefore(22), want: quiet(stAdmitted)},
		{name: "admission.claim_timeout names the ranks that did not claim", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) { g.apply(Delivered{Now: tClaim, Rank: g.rank(0).Key(), Attempt: 1}) }, ev: deadlineAt(22, nil),
			want: timedOut(PhaseAdmitted, "", FailureClaimTimeout,
				"Request 7 timed out after 20.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 1 pp 0) within admission.claim_timeout", 22)},
		{name: "timeouts.bootstrap before the claim timeout, both passed", from: stAdmitted.with("slow claims", slowClaims).at("5m0s"), ev: deadlineAt(402, nil),
			want: timedOut(PhaseAdmitted, "", FailureBootstrapTimeout,
				"Request 7 timed out after 402.0s in KVPoll.WaitingForInput: the destination was not claimed within timeouts.bootstrap (phase admitted; unclaimed prefill ranks: cp 0 tp 0 pp 0)", 402)},
		{name: "the claim timeout before timeouts.bootstrap, both passed", from: stAdmitted, ev: deadlineAt(300, nil),
			want: timedOut(PhaseAdmitted, "", FailureClaimTimeout,
				"Request 7 timed out after 298.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 0 pp 0) within admission.claim_timeout", 300)},
		{name: "T14: timeouts.waiting while ranks send", from: stClaimed, ev: deadlineAt(63, nil),
			want: timedOut(PhaseClaimed, "T14", FailureWaitingTimeout, waitingMsg, 63), says: []string{waitingMsg}},
		{name: "T14 not yet", from: stClaimed, ev: justBefore(63), want: quiet(stClaimed)},
		{name: "T14: the marker never came", from: stLandedNoMarker, ev: deadlineAt(63, nil),
			want: timedOut(PhaseTransferring, "T14", FailureWaitingTimeout,
				"Request 7 timed out after 60.0s in KVPoll.WaitingForInput (every chunk landed but the metadata slot never received the room marker)", 63)},
		{name: "T14 with a self-writing rank: it owes an ack", from: stClaimed.with("deferred", withDeferred), ev: deadlineAt(63, func(d *Deadline) { d.SelfWriter = true }),
			want: func() eff {
				w := timedOut(PhaseClaimed, "T14", FailureWaitingTimeout, waitingMsg, 63)
				w.Owing, w.Ledger, w.Release, w.Drain, w.Next = "[cp 0 tp 0 pp 0]", "drain", false, "started: attempt 1 ranks [cp 0 tp 0 pp 0] until 1m13s acks 0", "1m13s"
				return w
			}()},
		{name: "T18: staged KV not scattered within the completion timeout", from: stStaged,
			ev: deadlineAt(64, func(d *Deadline) {
				d.ScattersPending, d.ScatterMissing = true, []string{"chunk 1 of tp 1 to decode tp 0", "chunk 0 of tp 0 to decode tp 0"}
			}),
			want: timedOut(PhaseTransferring, "T18", FailureStagingFailed,
				"Request 7: staged KV was not scattered within 60.0s after every prefill rank reported (a scatter never arrived): chunk 1 of tp 1 to decode tp 0; chunk 0 of tp 0 to decode tp 0", 64)},
		{name: "the completion timeout not yet", from: stStaged, ev: justBefore(64), want: quiet(stStaged)},
		{name: "the completion timeout with nothing left to scatter: the waiting bound again, and the success check", from: stStaged,
			ev: deadlineAt(64, nil), want: eff{Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m4s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				e := g.apply(CheckSuccess{Now: sec(64)})
				if d := diff(digest(g.r, e), eff{Move: "transferring -> succeeded T12/T17", Note: "4 chunks, 4000 bytes", Ledger: "running", EndClaims: true,
					ClaimEnd: "done succeeded", Finished: "succeeded", SinceOpen: 64e9, Transferred: 62e9, Phase: PhaseSucceeded}); d != "" {
					t.Errorf("the success check after the completion timeout: %s", d)
				}
			}},
		{name: "the completion timeout of a room whose staging gate was lifted by name: the waiting bound fails it next",
			from: stClaimed.with("staged", withStaging),
			prep: func(g *rig) {
				g.scattersPending = true
				g.landAll(0) // no marker; the completion timeout runs until 64 s
				g.apply(Gate{Now: tDone, Name: StagingGate})
				g.apply(CheckSuccess{Now: tDone}) // no marker: no success, the completion timeout stays armed
			},
			ev: deadlineAt(64, nil), want: eff{Then: ThenCheckSuccess, Phase: PhaseTransferring, Next: "1m4s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if d := diff(digest(g.r, g.apply(Deadline{Now: sec(64)})), timedOut(PhaseTransferring, "T14", FailureWaitingTimeout,
					"Request 7 timed out after 61.0s in KVPoll.WaitingForInput (every chunk landed but the metadata slot never received the room marker)", 64)); d != "" {
					t.Errorf("the deadline again: %s", d)
				}
			}},
		{name: "timeouts.retracted", from: stRetracted, ev: deadlineAt(105, nil),
			want: timedOut(PhaseRetracted, "", FailureRetractTimeout,
				"Request 7 was retracted (RETRACT) and not resumed: its shard never had room for it again within timeouts.retracted (1m40s): it failed and its request slot went back to the pool", 105)},
		{name: "timeouts.retracted not yet", from: stRetracted, ev: justBefore(105), want: quiet(stRetracted)},
		{name: "timeouts.held", from: stHeld, ev: deadlineAt(205, nil),
			want: timedOut(PhaseHeld, "", FailureRetractTimeout,
				"Request 7 was held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came within timeouts.held (3m20s): it failed and its request slot went back to the pool", 205)},
		{name: "T23: a rebootstrap's bootstrap timeout names the recompute", from: stRebootstrapped, ev: deadlineAt(309, withURL),
			want: timedOut(PhaseWaitingPrefill, "", FailureBootstrapTimeout,
				"Request 7 timed out after 309.0s in KVPoll.Bootstrapping: the destination was not claimed within timeouts.bootstrap (phase waiting_prefill)"+recompute, 309)},
		{name: "T23 without the prefill's HTTP port", from: stRebootstrapped, ev: deadlineAt(309, nil),
			want: timedOut(PhaseWaitingPrefill, "", FailureBootstrapTimeout,
				"Request 7 timed out after 309.0s in KVPoll.Bootstrapping: the destination was not claimed within timeouts.bootstrap (phase waiting_prefill)"+noHTTP, 309)},
		{name: "T23: a rebootstrap's claim timeout names the recompute", from: stReadmitted, ev: deadlineAt(29, withURL),
			want: timedOut(PhaseAdmitted, "", FailureClaimTimeout,
				"Request 7 timed out after 20.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 0 pp 0) within admission.claim_timeout"+recompute, 29)},
		{name: "a running room has no deadline", from: stSucceeded, ev: deadlineAt(1e6, nil), want: quiet(stSucceeded)},
		{name: "a bound that moved: the claim timeout of a claimed room", from: stClaimed, ev: deadlineAt(22, nil), want: quiet(stClaimed)},
		{name: "release.deferred_timeout: the drain expires, the resources go back", from: draining(), ev: deadlineAt(15, nil),
			want: eff{Move: "failed -> failed ", Note: PagesReusableNote, Drain: "expired: attempt 1 ranks [cp 0 tp 0 pp 0] until  acks 0", Ledger: "release", Release: true, Phase: PhaseFailed},
			check: func(t *testing.T, g *rig, _ Effects) {
				if g.r.Draining() {
					t.Error("still draining")
				}
			}},
		{name: "release.deferred_timeout not yet", from: draining(), ev: justBefore(15), want: quiet(draining())},
		{name: "the quarantine ends: the resources go back", from: quarantined, ev: deadlineAt(30, nil),
			want: eff{Move: "failed -> failed ", Note: PagesReusableNote, Ledger: "release", Release: true, Phase: PhaseFailed}},
		{name: "the quarantine not yet", from: quarantined, ev: justBefore(30), want: quiet(quarantined)},
		{name: "the drain expires before the quarantine: the quarantine still holds", from: drainingQuarantined, ev: deadlineAt(15, nil),
			want: eff{Drain: "expired: attempt 1 ranks [cp 0 tp 1 pp 0] until  acks 0", Phase: PhaseFailed, Next: "30s"},
			check: func(t *testing.T, g *rig, _ Effects) {
				if d := diff(digest(g.r, g.apply(Deadline{Now: sec(30)})), eff{Move: "failed -> failed ", Note: PagesReusableNote, Ledger: "release", Release: true, Phase: PhaseFailed}); d != "" {
					t.Errorf("at the quarantine's end: %s", d)
				}
			}},
	})
}

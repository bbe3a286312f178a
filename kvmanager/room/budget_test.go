package room

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The request's deadline: its budget caps every bound of the first
// attempt's hand-off, fails the room naming the phase it was in and the one
// that used the budget, and bounds nothing once the hand-off succeeded or
// in a rebootstrap's attempt.

// withTimeout opens the room with the request's time budget.
func withTimeout(d time.Duration) rigOpt { return func(g *rig) { g.timeout = d } }

// budgetMsg is the failure of room 7 at its deadline in phase p.
func budgetMsg(timeout string, p Phase, waited string, most Phase, mostSpent, times string) string {
	return fmt.Sprintf("Request 7 exceeded its deadline (timeout %s from OpenRoom) in KVPoll.%s, phase %s: %s; phase %s used most of the budget (%s); time per phase: %s",
		timeout, p.Poll(), p, waited, most, mostSpent, times)
}

func TestRequestDeadline(t *testing.T) {
	budget := func(d time.Duration) rigOpt { return withTimeout(d) }
	waiting2s := stWaitingPrefill.with("2s budget", budget(2*time.Second)).at("2s")
	admitted10s := stAdmitted.with("10s budget", budget(10*time.Second)).at("10s")
	msgWaiting := budgetMsg("2s", PhaseWaitingPrefill, "prefill instance 10.0.0.1:8998 had not completed its registration",
		PhaseWaitingPrefill, "2s", "waiting_prefill 2s")
	msgAdmitted := budgetMsg("10s", PhaseAdmitted, "the destination was not claimed by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998",
		PhaseAdmitted, "8s", "waiting_prefill 1s, queued 1s, admitted 8s")
	// longQueue: a 10 s budget, 7 s of it queued, then admitted at 8 s and
	// claimed at 9 s.
	longQueue := state{name: "claimed after a long queue, 10s budget", opts: []rigOpt{budget(10 * time.Second)}, build: func(g *rig) {
		g.open()
		g.known(0)
		g.want(g.apply(Admitted{Now: sec(8), Pages: destPages, FillLen: destFill, MetadataSlot: destSlot}), PhaseAdmitted)
		for _, rk := range g.ranks() {
			g.attach(rk)
			g.exec(Delivered{Now: sec(9), Rank: rk.Key(), Attempt: 1})
		}
	}, phase: PhaseClaimed, next: "10s"}
	run(t, []row{
		{name: "the budget caps timeouts.bootstrap while waiting for the prefill", from: waiting2s, ev: deadlineAt(2, nil),
			want: timedOut(PhaseWaitingPrefill, "", FailureDeadlineExceeded, msgWaiting, 2), says: []string{msgWaiting}},
		{name: "not a nanosecond before", from: waiting2s, ev: justBefore(2), want: eff{Phase: PhaseWaitingPrefill, Next: "2s"}},
		{name: "the budget caps the DP-rank bound", from: stResolving.with("5s budget", budget(5*time.Second)).at("5s"), ev: deadlineAt(5, nil),
			want: timedOut(PhaseResolvingDP, "", FailureDeadlineExceeded, budgetMsg("5s", PhaseResolvingDP,
				"no rule resolved its prefill DP rank at 10.0.0.1:8998 (no BindRoom received)", PhaseResolvingDP, "4s", "waiting_prefill 1s, resolving_dp_rank 4s"), 5)},
		{name: "the budget caps admission", from: stQueued.with("3s budget", budget(3*time.Second)).at("3s"), ev: deadlineAt(3, nil),
			want: timedOut(PhaseQueued, "", FailureDeadlineExceeded, budgetMsg("3s", PhaseQueued,
				"it was not admitted on decode DP shard 0", PhaseQueued, "2s", "waiting_prefill 1s, queued 2s"), 3)},
		{name: "the budget caps the claim timeout: the prefill never claims", from: admitted10s, ev: deadlineAt(10, nil),
			want: timedOut(PhaseAdmitted, "", FailureDeadlineExceeded, msgAdmitted, 10), says: []string{msgAdmitted}},
		{name: "not a nanosecond before the claim's", from: admitted10s, ev: justBefore(10), want: eff{Phase: PhaseAdmitted, Next: "10s"}},
		{name: "a claim timeout earlier than the budget decides", from: stAdmitted.with("100s budget", budget(100*time.Second)), ev: deadlineAt(22, nil),
			want: timedOut(PhaseAdmitted, "", FailureClaimTimeout,
				"Request 7 timed out after 20.0s in KVPoll.WaitingForInput: the pre-allocated destination was not claimed by every required prefill rank (cp 0 tp 0 pp 0) within admission.claim_timeout", 22)},
		{name: "a budget ending with the claim timeout decides", from: stAdmitted.with("22s budget", budget(22*time.Second)), ev: deadlineAt(22, nil),
			want: timedOut(PhaseAdmitted, "", FailureDeadlineExceeded, budgetMsg("22s", PhaseAdmitted,
				"the destination was not claimed by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998", PhaseAdmitted, "20s", "waiting_prefill 1s, queued 1s, admitted 20s"), 22)},
		{name: "the budget caps timeouts.waiting", from: stClaimed.with("10s budget", budget(10*time.Second)).at("10s"), ev: deadlineAt(10, nil),
			want: timedOut(PhaseClaimed, "", FailureDeadlineExceeded, budgetMsg("10s", PhaseClaimed,
				"prefill ranks still sending: cp 0 tp 0 pp 0", PhaseClaimed, "7s", "waiting_prefill 1s, queued 1s, admitted 1s, claimed 7s"), 10)},
		{name: "the budget caps a transfer whose marker never came", from: stLandedNoMarker.with("10s budget", budget(10*time.Second)).at("10s"), ev: deadlineAt(10, nil),
			want: timedOut(PhaseTransferring, "", FailureDeadlineExceeded, budgetMsg("10s", PhaseTransferring,
				"every chunk landed but the metadata slot never received the room marker", PhaseTransferring, "6s",
				"waiting_prefill 1s, queued 1s, admitted 1s, claimed 1s, transferring 6s"), 10)},
		{name: "the phase that used most of the budget is named, not only the last", from: longQueue, ev: deadlineAt(10, nil),
			want: timedOut(PhaseClaimed, "", FailureDeadlineExceeded, budgetMsg("10s", PhaseClaimed,
				"prefill ranks still sending: cp 0 tp 0 pp 0", PhaseQueued, "7s", "waiting_prefill 1s, queued 7s, admitted 1s, claimed 1s"), 10)},
		{name: "a succeeded room: the budget bounds nothing", from: stSucceeded.with("10s budget", budget(10*time.Second)), ev: deadlineAt(1e6, nil),
			want: eff{Phase: PhaseSucceeded}},
		{name: "a retracted room: its own bound alone", from: stRetracted.with("10s budget", budget(10*time.Second)), ev: deadlineAt(10, nil),
			want: eff{Phase: PhaseRetracted, Next: "1m45s"}},
		{name: "a rebootstrap's attempt: the settings alone bound it", from: stRebootstrapped.with("10s budget", budget(10*time.Second)),
			ev: deadlineAt(10, nil), want: eff{Phase: PhaseWaitingPrefill, Next: "5m9s"}},
	})
}

// TestPhaseTimes: the time each phase of the hand-off took, from the
// timeline: every phase entered, in order, the current one up to now; a
// rebootstrap's attempt counted from its rebootstrap.
func TestPhaseTimes(t *testing.T) {
	for _, c := range []struct {
		from state
		now  float64
		want string
	}{
		{stWaitingPrefill, 0.5, "waiting_prefill 500ms"},
		{stAdmitted, 7, "waiting_prefill 1s, queued 1s, admitted 5s"},
		{stTransferring, 4, "waiting_prefill 1s, queued 1s, admitted 1s, claimed 1s, transferring 0s"},
		{stSucceeded, 100, "waiting_prefill 1s, queued 1s, admitted 1s, claimed 1s, transferring 0s"},
		{stFailed, 100, "waiting_prefill 1s, queued 1s, admitted 3s"},
		{stReadmitted, 12, "waiting_prefill 0s, queued 0s, admitted 3s"},
		{stAdmitted, 0, "waiting_prefill 1s, queued 1s"}, // no now: the phases it left
		{stFailed, 0, "waiting_prefill 1s, queued 1s, admitted 3s"},
	} {
		t.Run(c.from.name, func(t *testing.T) {
			g := newRig(t, c.from.opts...)
			c.from.build(g)
			now := sec(c.now)
			if c.now == 0 {
				now = time.Time{}
			}
			if got := PhaseTimesString(g.r.PhaseTimes(now)); got != c.want {
				t.Errorf("phase times at %vs %q, want %q", c.now, got, c.want)
			}
		})
	}
}

// TestBudgetShown: the snapshot says the budget and its deadline, and
// waiting_for the deadline while it bounds the room.
func TestBudgetShown(t *testing.T) {
	g := newRig(t, withTimeout(2500*time.Millisecond))
	stWaitingPrefill.build(g)
	s := g.r.Snapshot(false, false)
	if s.Timeout != 2500*time.Millisecond || !s.Deadline.Equal(sec(2.5)) {
		t.Errorf("snapshot timeout %s deadline %v, want 2.5s and t0+2.5s", s.Timeout, s.Deadline)
	}
	want := "; the request's deadline (timeout 2.5s) until " + sec(2.5).UTC().Format(time.RFC3339Nano)
	if w := g.r.WaitingFor(WaitView{}); !strings.HasSuffix(w, want) {
		t.Errorf("waiting_for %q, want it to end with %q", w, want)
	}
	g.known(0)
	g.admit()
	g.succeed()
	if w := g.r.WaitingFor(WaitView{}); strings.Contains(w, "deadline") {
		t.Errorf("waiting_for of a succeeded room %q names the deadline", w)
	}
	// A budget beyond MaxTimeout is cut to it.
	g = newRig(t, withTimeout(48*time.Hour))
	g.open()
	if s := g.r.Snapshot(false, false); s.Timeout != MaxTimeout || since(g.r.NextDeadline()) != "5m0s" {
		t.Errorf("a 48h budget: timeout %s, deadline %s; want %s and timeouts.bootstrap's 5m0s", s.Timeout, since(g.r.NextDeadline()), MaxTimeout)
	}
}

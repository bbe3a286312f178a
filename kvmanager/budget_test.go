package kvmanager

import (
	"errors"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/decodeplane/decodeplane/kvmanager/room"
)

// withTimeout opens a room with the request's time budget.
func withTimeout(d time.Duration) func(*OpenRequest) {
	return func(r *OpenRequest) { r.Timeout = d }
}

// TestDeadlineNoClaim: a room opened with a 2 s budget whose prefill never
// claims its destination fails at 2 s, not a nanosecond before, and not at
// admission.claim_timeout (60 s) or timeouts.bootstrap (300 s): with
// FailureDeadlineExceeded, naming the phase it was in and the time each
// phase took, which GetRoom shows too. Its resources go back.
func TestDeadlineNoClaim(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		opened := time.Now()
		h.open(addrA, 1, withTimeout(2*time.Second))
		s := h.wantPhase(1, PhaseAdmitted)
		if s.Timeout != 2*time.Second || !s.Deadline.Equal(opened.Add(2*time.Second)) {
			t.Errorf("GetRoom timeout %s deadline %v, want 2s and %v", s.Timeout, s.Deadline, opened.Add(2*time.Second))
		}
		if !strings.Contains(s.WaitingFor, "the request's deadline (timeout 2s)") {
			t.Errorf("waiting_for %q does not name the deadline", s.WaitingFor)
		}
		advance(2*time.Second - time.Nanosecond)
		s = h.wantPhase(1, PhaseAdmitted)
		// GetRoom's phase times are its timeline's: the phases it left (the
		// one it is in started at UpdatedAt).
		if got := room.PhaseTimesString(s.PhaseTimes); got != "waiting_prefill 0s, queued 0s" || !s.UpdatedAt.Equal(opened) {
			t.Errorf("phase times just before the deadline %q (updated %v)", got, s.UpdatedAt)
		}
		advance(time.Nanosecond)
		msg := h.wantFailure(1, FailureDeadlineExceeded, "Request 1 exceeded its deadline (timeout 2s from OpenRoom) in KVPoll.WaitingForInput, phase admitted: the destination was not claimed by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998; phase admitted used most of the budget (2s)")
		if !strings.HasSuffix(msg, "time per phase: waiting_prefill 0s, queued 0s, admitted 2s") {
			t.Errorf("failure %q, want the time per phase", msg)
		}
		s = h.snapshot(1)
		if got := room.PhaseTimesString(s.PhaseTimes); got != "waiting_prefill 0s, queued 0s, admitted 2s" {
			t.Errorf("GetRoom's phase times of the failed room %q", got)
		}
		if !s.UpdatedAt.Equal(opened.Add(2 * time.Second)) {
			t.Errorf("failed at %v, want the deadline %v", s.UpdatedAt, opened.Add(2*time.Second))
		}
		h.assertClean()
	})
}

// TestDeadlineBeforeRegistration: a room whose prefill never registers
// fails at its 3 s budget, in waiting_prefill, not after SGLang's retries.
func TestDeadlineBeforeRegistration(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.open(addrA, 1, withTimeout(3*time.Second))
		advance(3 * time.Second)
		h.wantFailure(1, FailureDeadlineExceeded, "Request 1 exceeded its deadline (timeout 3s from OpenRoom) in KVPoll.Bootstrapping, phase waiting_prefill: prefill instance 10.0.0.1:8998 had not completed its registration")
		h.assertClean()
	})
}

// TestDeadlineMet: a room that succeeds within its budget is not touched
// by it afterwards: it runs until the engine releases it.
func TestDeadlineMet(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(instance{addr: addrA})
		h.open(addrA, 1, withTimeout(time.Second))
		advance(500 * time.Millisecond)
		h.complete(1)
		if got := room.PhaseTimesString(h.snapshot(1).PhaseTimes); got != "waiting_prefill 0s, queued 0s, admitted 500ms, claimed 0s, transferring 0s" {
			t.Errorf("phase times of the succeeded room %q", got)
		}
		advance(time.Hour)
		h.wantPhase(1, PhaseSucceeded)
		h.release(1)
		h.assertClean()
	})
}

// TestDeadlineBounds: OpenRoom refuses a budget below a millisecond or
// beyond room.MaxTimeout, naming the field, and opens nothing.
func TestDeadlineBounds(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		for _, d := range []time.Duration{-time.Second, time.Microsecond, room.MaxTimeout + time.Millisecond} {
			req := openReq(addrA, 1)
			req.Timeout = d
			_, _, err := h.m.OpenRoom(t.Context(), req)
			var inv *InvalidError
			if !errors.As(err, &inv) || inv.Field != "timeout" {
				t.Errorf("OpenRoom with timeout %s = %v, want InvalidError on timeout", d, err)
			}
		}
		if _, err := h.m.GetRoom(1, false); !errors.Is(err, ErrRoomNotFound) {
			t.Errorf("GetRoom after the refusals = %v, want not found", err)
		}
	})
}

// TestDeadlineInTrace: the room span says the budget
// (decodeplane.timeout_ms), each phase event what was left of it
// (budget_left_ms), and at the end the time each phase took
// (decodeplane.phase_ms.<phase>) with the failure.
func TestDeadlineInTrace(t *testing.T) {
	bubble(t, func(t *testing.T) {
		spans := tracetest.NewInMemoryExporter()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
		h := newHarness(t, withTracer(tp))
		h.open(addrA, 1, withTimeout(2*time.Second))
		advance(500 * time.Millisecond)
		h.register(instance{addr: addrA})
		advance(1500 * time.Millisecond)
		h.wantPhase(1, PhaseFailed)
		var got *tracetest.SpanStub
		for _, s := range spans.GetSpans() {
			if s.Name == "room" {
				got = &s
			}
		}
		if got == nil {
			t.Fatalf("no room span among %d spans", len(spans.GetSpans()))
		}
		attrs := map[string]string{}
		for _, a := range got.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		for k, v := range map[string]string{"decodeplane.timeout_ms": "2000", "decodeplane.phase_ms.waiting_prefill": "500",
			"decodeplane.phase_ms.queued": "0", "decodeplane.phase_ms.admitted": "1500", "failure.code": "deadline_exceeded"} {
			if attrs[k] != v {
				t.Errorf("room span %s = %q, want %q (attributes %v)", k, attrs[k], v, attrs)
			}
		}
		var left []string
		for _, ev := range got.Events {
			var phase, budget string
			for _, a := range ev.Attributes {
				switch a.Key {
				case "phase":
					phase = a.Value.Emit()
				case "budget_left_ms":
					budget = a.Value.Emit()
				}
			}
			left = append(left, phase+":"+budget)
		}
		if want := "waiting_prefill:2000 queued:1500 admitted:1500 failed:"; strings.Join(left, " ") != want {
			t.Errorf("phase events (phase:budget_left_ms) %q, want %q", strings.Join(left, " "), want)
		}
	})
}

package kvmanager

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"
)

// Rebootstrap (SGLang T21–T23) and the deadlines of parked rooms.
//
// A REBOOTSTRAP retraction holds a running room (pages freed) until
// ContinueGeneration, which starts its next attempt on the prefill DP rank
// it was bound to (the binding survives the retraction: sglang#40730/#40731).
// The daemon does not have the prompt, so it cannot ask the prefill to
// recompute: ContinueGenerationResumed gives the decode engine, per resumed
// room, what it needs to POST the request to the prefill's /generate (the
// prefill's HTTP endpoint: the host of its bootstrap address and the
// prefill_http_port it registered with; the pinned DP rank). The prefill
// then claims the new attempt's destination and sends its KV as on a first
// attempt (T23).
//
// A retracted room (RETRACT, T20) is bounded by timeouts.retracted and a
// held room (REBOOTSTRAP, T21) by timeouts.held, both from the retraction,
// on the room's entry of the one deadline heap (room.nextDeadline); when the
// bound passes the room fails with FailureRetractTimeout and a message
// naming the setting.

// Resumed is one room ContinueGeneration re-enqueued, with what the decode
// engine needs to request its prefill's recompute.
type Resumed struct {
	Room    uint64
	RID     string
	Attempt uint32 // the new attempt (the destination's generation)
	Phase   Phase  // after the re-enqueue (Failed when it could not start again)
	// PrefillAddr is the prefill's bootstrap address (host:port).
	PrefillAddr string
	// PrefillHTTPHost and PrefillHTTPPort are the prefill's HTTP server
	// (the bootstrap host, the registration's prefill_http_port; port 0:
	// the prefill is not registered or registered no HTTP port);
	// GenerateURL is http://host:port/generate ("" without a port).
	PrefillHTTPHost string
	PrefillHTTPPort int
	GenerateURL     string
	// PrefillDP is the prefill DP rank the room is pinned to (-1: none was
	// resolved).
	PrefillDP int
}

// ContinueGenerationResumed is ContinueGeneration with, per resumed room,
// its prefill's HTTP endpoint and pinned DP rank, read under the room's
// shard lock right after the re-enqueue.
func (m *Manager) ContinueGenerationResumed(ctx context.Context) []Resumed {
	var out []Resumed
	m.eachShard(func(sh *shard) {
		resumed := sh.led.ResumeHeld()
		m.failDroppedHeldLocked(sh, resumed)
		m.rebootstrapLocked(ctx, sh, resumed)
		for _, id := range resumed {
			if r := sh.rooms[id]; r != nil {
				out = append(out, m.resumedLocked(r))
			} else {
				out = append(out, Resumed{Room: id, Phase: PhaseFailed, PrefillDP: -1})
			}
		}
	})
	return out
}

// resumedLocked describes a re-enqueued room (its shard's lock held).
func (m *Manager) resumedLocked(r *room) Resumed {
	host, port, url := m.prefillHTTPLocked(r.addr)
	return Resumed{Room: r.id, RID: r.rid(), Attempt: r.attempt, Phase: r.phase, PrefillAddr: r.addr,
		PrefillHTTPHost: host, PrefillHTTPPort: port, GenerateURL: url, PrefillDP: r.prefillDP}
}

// prefillHTTPLocked is the HTTP endpoint of the prefill instance at addr:
// the bootstrap address's host and the registration's prefill_http_port
// (0 and "" when the instance is not registered or gave no port).
func (m *Manager) prefillHTTPLocked(addr string) (host string, port int, generateURL string) {
	host = addr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		host = h
	}
	if info, ok := m.reg.Info(addr); ok && info.HTTPPort > 0 {
		port = info.HTTPPort
		generateURL = "http://" + net.JoinHostPort(host, strconv.Itoa(port)) + "/generate"
	}
	return host, port, generateURL
}

// recomputeNoteLocked says how a rebootstrapped room's prefill is asked to
// recompute (the engine's POST to /generate, pinned to its DP rank); "" on
// a first attempt.
func (m *Manager) recomputeNoteLocked(r *room) string {
	if r.attempt <= 1 {
		return ""
	}
	_, _, url := m.prefillHTTPLocked(r.addr)
	if url == "" {
		url = "the prefill's /generate (" + r.addr + " registered no prefill_http_port)"
	}
	return fmt.Sprintf("; rebootstrap attempt %d: the prefill sends only after the decode engine's recompute request (POST %s, pinned to prefill DP rank %d, from ContinueGeneration's answer)", r.attempt, url, r.prefillDP)
}

// parkLocked bounds a room just retracted (held: REBOOTSTRAP) by
// timeouts.retracted (timeouts.held) from now; applyLocked arms it.
func (m *Manager) parkLocked(r *room, now time.Time, held bool) {
	bound := m.cfg.Timeouts.Retracted
	if held {
		bound = m.cfg.Timeouts.Held
	}
	if bound <= 0 {
		bound = DefaultParkedTimeout
	}
	r.parkedAt = stampOf(now.Add(bound))
}

// parkedTimeoutLocked fails a retracted or held room whose bound passed.
func (m *Manager) parkedTimeoutLocked(r *room, now time.Time) {
	key, what := "timeouts.retracted", "retracted (RETRACT) and not resumed: its shard never had room for it again"
	if r.phase == PhaseHeld {
		key, what = "timeouts.held", "held for rebootstrap (REBOOTSTRAP) and no ContinueGeneration came"
	}
	m.failLocked(r, Failure{Code: FailureRetractTimeout, Message: fmt.Sprintf(
		"Request %d was %s within %s (%s): it failed and its request slot went back to the pool",
		r.id, what, key, now.Sub(r.updatedAt.time()).Round(time.Millisecond))})
}

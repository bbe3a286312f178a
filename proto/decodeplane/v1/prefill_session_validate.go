package decodeplanev1

import (
	"errors"
	"fmt"
)

// Bounds of a PrefillSession message (prefill_session.proto).
const (
	MaxPrefillTraceparentLen = MaxTraceparentLen // PrefillRequest.traceparent: the engine session's bound and format
	MaxPrefillTracestateLen  = 512               // PrefillRequest.tracestate
	// MaxPrefillRequestsPerMessage bounds PrefillRequest.more.
	MaxPrefillRequestsPerMessage = 64
	// MaxPrefillEventsPerMessage bounds PrefillEvent.more (what the daemon
	// packs into one message).
	MaxPrefillEventsPerMessage = 64
)

// CheckBatch checks a message's more (its entries are then handled in
// order, each as a message): at most MaxPrefillRequestsPerMessage entries,
// none with a more of its own, none a hello. An error names the field; the
// server ends the stream with it.
func (x *PrefillRequest) CheckBatch() error {
	more := x.GetMore()
	if len(more) > MaxPrefillRequestsPerMessage {
		return fieldErr("more", "has %d messages (at most %d per message)", len(more), MaxPrefillRequestsPerMessage)
	}
	for i, m := range more {
		switch {
		case len(m.GetMore()) > 0:
			return fieldErr(fmt.Sprintf("more[%d].more", i), "must be empty (messages are not nested)")
		case m.GetHello() != nil:
			return fieldErr(fmt.Sprintf("more[%d].hello", i), "a session has one hello, the first message, alone")
		}
	}
	return nil
}

// PrefillRequest deliberately has no Validate method: the server's stream
// interceptor would end the whole session on the first bad message. The
// session's handler checks the envelope (CheckEnvelope) and each op's
// request with that request's own Validate, so that a bad op is a result
// naming the field and the stream stays open.

// CheckEnvelope checks what a session message carries besides its op: seq
// within 0..2^63-1, a traceparent that is empty or W3C's format (as the
// engine session's, checkTraceparent), a bounded tracestate.
func (x *PrefillRequest) CheckEnvelope() error {
	return errors.Join(
		checkMax("seq", x.GetSeq(), maxRoom),
		checkTraceparent("traceparent", x.GetTraceparent()),
		checkLen("tracestate", x.GetTracestate(), false, MaxPrefillTracestateLen, "W3C trace state"),
	)
}

// Validate implements the validator interceptor's contract (used by the
// session's handler for the hello).
func (x *PrefillHello) Validate() error {
	return errors.Join(x.GetRank().validate("rank"), checkLen("instance_id", x.GetInstanceId(), false, MaxInstanceIDLen, "the prefill process's id"))
}

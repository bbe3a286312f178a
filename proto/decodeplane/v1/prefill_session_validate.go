package decodeplanev1

import "errors"

// Bounds of a PrefillSession message (prefill_session.proto).
const (
	MaxPrefillTraceparentLen = MaxTraceparentLen // PrefillRequest.traceparent: the engine session's bound and format
	MaxPrefillTracestateLen  = 512               // PrefillRequest.tracestate
)

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

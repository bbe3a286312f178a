package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Error families. Every error returned by an RPC method of this package is a
// *Error that matches exactly one of these with errors.Is (ErrDeadlineExceeded
// and ErrCanceled also match context.DeadlineExceeded and context.Canceled).
// Compare with errors.Is, never with ==.
var (
	// ErrNotFound: the room or prefill rank is unknown (never opened, forgotten
	// after its retention, or, for Heartbeat, declared dead: register again).
	// codes.NotFound. Not retried.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the room is already open (under another idempotency
	// key, or without one). codes.AlreadyExists. Not retried.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalidArgument: a request field is wrong; the message names the
	// field. codes.InvalidArgument (and OutOfRange). Not retried.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrFailedPrecondition: the call does not apply now (the room is not in
	// the right phase, the prefill's layout cannot serve this decode side).
	// codes.FailedPrecondition. Not retried.
	ErrFailedPrecondition = errors.New("failed precondition")
	// ErrResourceExhausted: the daemon is out of room (admission queue full,
	// too many waiters, a watch fell behind). (*Error).RetryAfter says when
	// to try again. codes.ResourceExhausted. Retried after the server's delay
	// by RPCs that are safe to retry.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrUnavailable: the daemon is draining, unreachable, or its transfer
	// agent is down. codes.Unavailable. Retried by RPCs that are safe to retry.
	ErrUnavailable = errors.New("unavailable")
	// ErrUnauthenticated: the daemon has a bootstrap token and the call did
	// not carry it (see WithToken). codes.Unauthenticated. Not retried.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: codes.PermissionDenied. decodeplane does not return
	// it today; a proxy in front of it may. Not retried.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrAborted: a chunk failed and the room is now failed (Transfer,
	// ReportTransfer). codes.Aborted. Not retried.
	ErrAborted = errors.New("aborted")
	// ErrDeadlineExceeded: the context's deadline passed. It also matches
	// context.DeadlineExceeded. codes.DeadlineExceeded. Not retried.
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	// ErrCanceled: the context was cancelled, or the Client was closed. It
	// also matches context.Canceled. codes.Canceled. Not retried.
	ErrCanceled = errors.New("canceled")
	// ErrUnimplemented: the daemon does not serve this RPC (an older daemon,
	// or a service it was built without). codes.Unimplemented. Not retried.
	ErrUnimplemented = errors.New("unimplemented")
	// ErrInternal: a bug in the daemon (logged there with the trace id) or a
	// corrupted answer. codes.Internal, Unknown and DataLoss. Not retried.
	ErrInternal = errors.New("internal error")

	// ErrRoomFailed matches every *RoomFailedError: the room ended in
	// ROOM_PHASE_FAILED (aborted, timed out, a chunk failed, the prefill was
	// lost, ...).
	ErrRoomFailed = errors.New("room failed")
)

// familyOf maps each gRPC code to its family.
var familyOf = map[codes.Code]error{
	codes.NotFound:           ErrNotFound,
	codes.AlreadyExists:      ErrAlreadyExists,
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.OutOfRange:         ErrInvalidArgument,
	codes.FailedPrecondition: ErrFailedPrecondition,
	codes.ResourceExhausted:  ErrResourceExhausted,
	codes.Unavailable:        ErrUnavailable,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.PermissionDenied:   ErrPermissionDenied,
	codes.Aborted:            ErrAborted,
	codes.DeadlineExceeded:   ErrDeadlineExceeded,
	codes.Canceled:           ErrCanceled,
	codes.Unimplemented:      ErrUnimplemented,
	codes.Internal:           ErrInternal,
	codes.Unknown:            ErrInternal,
	codes.DataLoss:           ErrInternal,
}

// Error is an RPC failure: the gRPC status the daemon (or the gRPC stack)
// returned, the RPC it came from, and its family. status.Code(err),
// status.FromError(err) and errors.Is(err, client.ErrX) all work on it, also
// when it is wrapped.
type Error struct {
	op     string
	st     *status.Status
	family error
}

// newError builds the Error for a status returned by op.
func newError(op string, st *status.Status) *Error {
	if st == nil || st.Code() == codes.OK {
		st = status.New(codes.Unknown, "no error status")
	}
	f := familyOf[st.Code()]
	if f == nil {
		f = ErrInternal
	}
	return &Error{op: op, st: st, family: f}
}

// localError is an *Error the client raises itself, with a code chosen to
// match what the daemon would have said.
func localError(op string, code codes.Code, format string, args ...any) *Error {
	return newError(op, status.New(code, fmt.Sprintf(format, args...)))
}

// toError turns a non-nil error returned by the gRPC stack into an *Error.
func toError(op string, err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		if _, ok := status.FromError(err); !ok {
			return newError(op, status.FromContextError(err))
		}
	}
	return newError(op, status.Convert(err))
}

// Error renders "Op: family: message", e.g.
// "GetRoom: not found: get room 42: room not found".
func (e *Error) Error() string {
	return e.op + ": " + e.family.Error() + ": " + e.st.Message()
}

// Is matches the error's family (ErrNotFound, ...), and context.Canceled or
// context.DeadlineExceeded for ErrCanceled and ErrDeadlineExceeded.
func (e *Error) Is(target error) bool {
	switch target {
	case e.family:
		return true
	case context.Canceled:
		return e.family == ErrCanceled
	case context.DeadlineExceeded:
		return e.family == ErrDeadlineExceeded
	}
	return false
}

// GRPCStatus returns the status, so that status.Code and status.FromError
// see through the Error.
func (e *Error) GRPCStatus() *status.Status { return e.st }

// Status returns the gRPC status, with its details.
func (e *Error) Status() *status.Status { return e.st }

// Code returns the gRPC code.
func (e *Error) Code() codes.Code { return e.st.Code() }

// Message returns the daemon's message: for InvalidArgument it names the
// field; for FailedPrecondition and room failures it uses SGLang's wording
// where SGLang has one.
func (e *Error) Message() string { return e.st.Message() }

// Op returns the RPC (or helper) that failed, e.g. "OpenRoom".
func (e *Error) Op() string { return e.op }

// RetryAfter returns the delay the daemon asked for in an
// errdetails.RetryInfo (ResourceExhausted and Unavailable answers carry one),
// or 0 when there is none.
func (e *Error) RetryAfter() time.Duration {
	d, _ := retryInfo(e.st)
	return d
}

// retryInfo extracts the RetryInfo delay of a status.
func retryInfo(st *status.Status) (time.Duration, bool) {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return max(ri.GetRetryDelay().AsDuration(), 0), true
		}
	}
	return 0, false
}

// RetryAfter returns the retry delay carried by err (see (*Error).RetryAfter)
// and whether err carried one.
func RetryAfter(err error) (time.Duration, bool) {
	var e *Error
	if !errors.As(err, &e) {
		return 0, false
	}
	return retryInfo(e.st)
}

// RoomFailedError is a room that ended in ROOM_PHASE_FAILED, as a stream
// (AwaitDestination, WatchRoom) or a room's state reported it. It matches
// ErrRoomFailed. When an RPC revealed the failure (a Transfer answered
// Aborted), Err is that RPC's *Error, and errors.Is and status.Code see it
// too.
type RoomFailedError struct {
	// Room is the bootstrap room.
	Room uint64
	// Code classifies the failure.
	Code pb.FailureCode
	// Message is the daemon's reason, in SGLang's wording where SGLang has one
	// (e.g. "Aborted by AbortReq.").
	Message string
	// FromAnotherRank is true when another prefill rank reported the failure.
	FromAnotherRank bool
	// AckRequired: the claim stream said this rank must acknowledge the
	// room's end (AckRoomEnd) once it stopped writing; SendRoom and
	// ReportRoom do it themselves (drain.go).
	AckRequired bool
	// Err is the RPC error that revealed the failure, if any.
	Err error
}

// roomFailed builds the error for a failure of room.
func roomFailed(room uint64, f *pb.Failure) *RoomFailedError {
	return &RoomFailedError{Room: room, Code: f.GetCode(), Message: f.GetMessage(), FromAnotherRank: f.GetFromAnotherRank()}
}

// Error renders "room 42 failed (FAILURE_CODE_ABORTED): Aborted by AbortReq.".
func (e *RoomFailedError) Error() string {
	return fmt.Sprintf("room %d failed (%s): %s", e.Room, e.Code, e.Message)
}

// Is matches ErrRoomFailed.
func (e *RoomFailedError) Is(target error) bool { return target == ErrRoomFailed }

// Unwrap returns the RPC error that revealed the failure, if any.
func (e *RoomFailedError) Unwrap() error { return e.Err }

// ErrIncarnationChanged matches every *IncarnationChangedError: the daemon
// restarted (its incarnation changed), so every destination the prefill
// received from the earlier incarnation is void.
var ErrIncarnationChanged = errors.New("daemon incarnation changed")

// IncarnationChangedError is a hand-off (or a DestinationStream) stopped
// because the destination it held belongs to an earlier incarnation of the
// daemon: the daemon restarted, and may already have given those pages to
// another room. No write or report for that destination starts once the
// client knows (one already started has its context cancelled, and the
// daemon refuses it by its incarnation). Register again (Prefill.RunHeartbeat does it on its
// next beat) and claim the room again. A RoomWatch (WaitRoom,
// OpenAndWait) of a room the restart lost ends with it too (Watch set). It
// matches ErrIncarnationChanged.
type IncarnationChangedError struct {
	// Room is the room whose destination is void (0: not about one room).
	Room uint64
	// Old is the incarnation of the void destination (or of the
	// registration the claim named); New is the daemon's incarnation as the
	// client learned it (0 when the daemon's refusal did not give it).
	Old, New uint64
	// Err is the RPC error that revealed the change (a STALE_INCARNATION
	// refusal, or a re-opened RoomWatch's NOT_FOUND), if any.
	Err error
	// Watch: a RoomWatch (WaitRoom, OpenAndWait) ended, on the decode side:
	// the room was opened at incarnation Old and is gone with it; open it
	// again. Old and New are then the daemon's incarnations.
	Watch bool
}

// Error renders "room 7: destination of decodeplane incarnation 1f (now
// 2e) is void: ... register again and claim again" ("decodeplane
// incarnation 1f (now 2e) is gone: ..." when it is about no room), or with
// Watch "room 7: opened at decodeplane incarnation 1f (now 2e): ... open it
// again".
func (e *IncarnationChangedError) Error() string {
	if e.Watch {
		return fmt.Sprintf("room %d: opened at decodeplane incarnation %x (now %x): the daemon restarted and the room is gone; open it again", e.Room, e.Old, e.New)
	}
	if e.Room == 0 { // not about one room: a session, a heartbeat
		return fmt.Sprintf("decodeplane incarnation %x (now %x) is gone: the daemon restarted; register again and claim again", e.Old, e.New)
	}
	return fmt.Sprintf("room %d: destination of decodeplane incarnation %x (now %x) is void: the daemon restarted; register again and claim again", e.Room, e.Old, e.New)
}

// Is matches ErrIncarnationChanged.
func (e *IncarnationChangedError) Is(target error) bool { return target == ErrIncarnationChanged }

// Unwrap returns the RPC error that revealed the change, if any.
func (e *IncarnationChangedError) Unwrap() error { return e.Err }

// reasonStaleIncarnation is the daemon's ErrorInfo reason for a request
// that names an earlier incarnation (server.ReasonStaleIncarnation).
const reasonStaleIncarnation = "STALE_INCARNATION"

// StaleIncarnation reports whether err is the daemon's refusal of a request
// that named an earlier incarnation (FAILED_PRECONDITION with ErrorInfo
// reason STALE_INCARNATION), with the incarnation the request named and the
// daemon's own (0 when the refusal does not give them).
func StaleIncarnation(err error) (named, daemon uint64, ok bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code() != codes.FailedPrecondition {
		return 0, 0, false
	}
	for _, d := range e.st.Details() {
		if ei, isInfo := d.(*errdetails.ErrorInfo); isInfo && ei.GetReason() == reasonStaleIncarnation {
			named, _ = strconv.ParseUint(ei.GetMetadata()["incarnation"], 16, 64)
			daemon, _ = strconv.ParseUint(ei.GetMetadata()["daemon_incarnation"], 16, 64)
			return named, daemon, true
		}
	}
	return 0, 0, false
}

// errorDomain is the domain of the daemon's ErrorInfo details
// (server.ErrorDomain).
const errorDomain = "decodeplane.v1"

// reasonPageHeld is the daemon's ErrorInfo reason for a declaration that
// names a page, row or slot another room's hand-off still holds
// (server.ReasonPageHeld).
const reasonPageHeld = "PAGE_HELD"

// Held is what a refused declaration found held (PageHeld).
type Held struct {
	// What is "page", "metadata slot", or a state type and "slot"; Index
	// its index.
	What  string
	Index int32
	// Holder is the room whose hand-off holds it; Draining: that room
	// failed and waits for its prefill ranks' acknowledgements (its
	// WatchRoom ends with pages_reusable once they are reusable).
	Holder   uint64
	Draining bool
}

// PageHeld reports whether err is the daemon's refusal of a declaration
// (DeclareDestination, over the unary RPC or the engine session) that
// names a page, metadata row or state slot another room's hand-off still
// holds (FAILED_PRECONDITION with ErrorInfo reason PAGE_HELD), and what it
// found held, and by whom.
func PageHeld(err error) (Held, bool) {
	var e *Error
	if !errors.As(err, &e) || e.Code() != codes.FailedPrecondition {
		return Held{}, false
	}
	for _, d := range e.st.Details() {
		if ei, isInfo := d.(*errdetails.ErrorInfo); isInfo && ei.GetReason() == reasonPageHeld {
			md := ei.GetMetadata()
			h := Held{What: md["what"], Draining: md["draining"] == "true"}
			idx, _ := strconv.ParseInt(md["index"], 10, 32)
			h.Index = int32(idx)
			h.Holder, _ = strconv.ParseUint(md["holder"], 10, 64)
			return h, true
		}
	}
	return Held{}, false
}

// unprefix rebuilds an open's refusal as OpenRoom gives it: the batch's
// field prefix (open.rooms[i].) removed from each line of the message.
func unprefix(err error, prefix string) error {
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(e.Message(), prefix) {
		return err
	}
	lines := strings.Split(e.Message(), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, prefix)
	}
	sp := e.Status().Proto() // a copy: the details (RetryInfo) stay
	sp.Message = strings.Join(lines, "\n")
	return newError(e.Op(), status.FromProto(sp))
}

// reop is err as the unary RPC op returns it: the same status (code,
// message, details) under op's name.
func reop(op string, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return newError(op, e.Status())
	}
	return toError(op, err)
}

// ctxEnd is the *Error of op for ctx's end.
func ctxEnd(op string, err error) *Error {
	return newError(op, status.FromContextError(err))
}

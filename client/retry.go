package client

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// RetryPolicy bounds automatic retries. A zero field takes its default
// (DefaultRetryPolicy); MaxAttempts 1 turns retries off.
type RetryPolicy struct {
	// MaxAttempts counts every attempt of one call, the first included
	// (default 4). For streams it counts consecutive failed (re-)opens: a
	// stream that returned a new event starts afresh.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt when the daemon
	// gave no RetryInfo (default 50ms). It doubles after each attempt, with
	// jitter (each wait is drawn from [b/2, b]).
	InitialBackoff time.Duration
	// MaxBackoff caps the doubling (default 1s). A RetryInfo delay from the
	// daemon is honoured as given, even above MaxBackoff.
	MaxBackoff time.Duration
}

// DefaultRetryPolicy returns the policy New uses: 4 attempts, 50ms doubling
// to 1s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 4, InitialBackoff: 50 * time.Millisecond, MaxBackoff: time.Second}
}

// withDefaults fills zero fields.
func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.MaxAttempts == 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.InitialBackoff == 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = max(d.MaxBackoff, p.InitialBackoff)
	}
	return p
}

// validate reports a policy that cannot be applied.
func (p RetryPolicy) validate() error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("retry policy: MaxAttempts %d must be >= 1 (or 0 for the default 4)", p.MaxAttempts)
	case p.InitialBackoff < 0 || p.MaxBackoff < 0:
		return fmt.Errorf("retry policy: backoffs must not be negative (initial %s, max %s)", p.InitialBackoff, p.MaxBackoff)
	case p.MaxBackoff != 0 && p.MaxBackoff < p.InitialBackoff:
		return fmt.Errorf("retry policy: MaxBackoff %s is below InitialBackoff %s", p.MaxBackoff, p.InitialBackoff)
	}
	return nil
}

// backoff returns the jittered wait after the n-th failed attempt (n >= 1).
func (p RetryPolicy) backoff(n int) time.Duration {
	b := p.InitialBackoff
	for i := 1; i < n && b < p.MaxBackoff; i++ {
		b *= 2
	}
	b = min(b, p.MaxBackoff)
	if b <= 1 {
		return b
	}
	half := b / 2
	return half + rand.N(b-half+1)
}

// retryClass says when an RPC may be sent again automatically.
type retryClass int

const (
	// retryNever: the RPC is not idempotent, or a blind repeat could do harm;
	// the caller decides.
	retryNever retryClass = iota
	// retrySafe: reads, and writes the daemon deduplicates.
	retrySafe
	// retryIfKeyed: safe only when the request carries an idempotency key.
	retryIfKeyed
)

// retryTable classifies every RPC of the services this package wraps. It is
// the client's side of the contract written in each RPC's proto comment. An
// RPC missing from the table is never retried (TestRetryTableCoversEveryRPC
// fails until it is classified); a new service (Staging) adds its methods
// here.
//
// Only Unavailable, and ResourceExhausted carrying a RetryInfo, are retried;
// InvalidArgument, FailedPrecondition, NotFound, AlreadyExists and every
// other code never are.
var retryTable = map[string]retryClass{
	// Admin.
	pb.Admin_GetStatus_FullMethodName: retrySafe,
	// Drain is idempotent on the daemon, but stopping admission is an
	// operator's decision: a repeat is left to the operator.
	pb.Admin_Drain_FullMethodName: retryNever,

	// Bootstrap: registration is idempotent per rank; heartbeats and
	// bindings overwrite; lookups read.
	pb.Bootstrap_RegisterPrefill_FullMethodName: retrySafe,
	pb.Bootstrap_Heartbeat_FullMethodName:       retrySafe,
	// A second deregistration finds nothing to remove (deregistered false).
	pb.Bootstrap_DeregisterPrefill_FullMethodName: retrySafe,
	pb.Bootstrap_BindRoom_FullMethodName:          retrySafe,
	pb.Bootstrap_LookupDPRanks_FullMethodName:     retrySafe,

	// Rooms.
	// OpenRoom: a repeat without a key would see AlreadyExists for a room
	// the first attempt opened; with a key the daemon answers existing=true.
	pb.Rooms_OpenRoom_FullMethodName: retryIfKeyed,
	// Streams are re-opened; the daemon re-delivers the destination or the
	// room's current state.
	pb.Rooms_AwaitDestination_FullMethodName: retrySafe,
	pb.Rooms_WatchRoom_FullMethodName:        retrySafe,
	// (room, rank, chunk_index) is the daemon's idempotency key.
	pb.Rooms_Transfer_FullMethodName:       retrySafe,
	pb.Rooms_ReportTransfer_FullMethodName: retrySafe,
	pb.Rooms_GetRoom_FullMethodName:        retrySafe,
	pb.Rooms_ListRooms_FullMethodName:      retrySafe,
	// Idempotent on the daemon (a second abort or release is OK).
	pb.Rooms_AbortRoom_FullMethodName:   retrySafe,
	pb.Rooms_AckRoomEnd_FullMethodName:  retrySafe, // idempotent per rank and generation
	pb.Rooms_ReleaseRoom_FullMethodName: retrySafe,
	// Not safe blindly: the engine re-reports absolute lengths on its own
	// schedule; retracting or resuming twice changes what happens.
	pb.Rooms_ReportRunning_FullMethodName:      retryNever,
	pb.Rooms_RetractRoom_FullMethodName:        retryNever,
	pb.Rooms_ContinueGeneration_FullMethodName: retryNever,
	// A repeat after a lost answer would see AlreadyExists for the rooms
	// the first attempt adopted (client/resync.go resends the rest).
	pb.Rooms_Resync_FullMethodName: retryNever,
	// A repeated declaration answers already: the daemon deduplicates.
	pb.Rooms_DeclareDestination_FullMethodName: retrySafe,
	// The same layout again answers already: registration is idempotent.
	pb.Rooms_RegisterEngineLayout_FullMethodName: retrySafe,

	// Fleet: a read of the daemon's cached view.
	pb.Fleet_GetFleet_FullMethodName: retrySafe,
	// Capacity: safe to repeat (each stream starts with the current
	// figures), but CapacityStream does not re-open by itself: the end of
	// the stream is how a router learns that the daemon stopped or is
	// unreachable, so the router re-opens it (capacity.go).
	pb.Capacity_WatchCapacity_FullMethodName: retryNever,
	// Each report replaces the last.
	pb.Capacity_ReportCapacity_FullMethodName: retrySafe,
	// EngineSession: a stream of ops, not re-opened as such
	// (engine_session.go): OpenAndWait's shared session opens a new one and
	// resumes its rooms' events (engine_mux.go).
	pb.EngineSession_Session_FullMethodName: retryNever,
	// PrefillSession: a session does not re-open itself; the rank's shared
	// session opens a new one and claims again (the daemon re-delivers;
	// prefill_mux.go).
	pb.PrefillSession_Session_FullMethodName: retryNever,
}

// keyed is a request that may carry an idempotency key.
type keyed interface{ GetIdempotencyKey() string }

// retryable reports whether method may be retried for this request.
func retryable(method string, req any) bool {
	switch retryTable[method] {
	case retrySafe:
		return true
	case retryIfKeyed:
		k, ok := req.(keyed)
		return ok && k.GetIdempotencyKey() != ""
	}
	return false
}

// retryDelay reports whether a failed attempt may be retried and after how
// long: Unavailable (after the RetryInfo delay when the daemon gave one,
// else the policy's backoff), and ResourceExhausted only with a RetryInfo
// (without one it is the gRPC stack refusing, e.g. a message too large).
func (p RetryPolicy) retryDelay(st *status.Status, attempt int) (time.Duration, bool) {
	ri, hasRI := retryInfo(st)
	switch st.Code() {
	case codes.Unavailable:
		if hasRI {
			return ri, true
		}
		return p.backoff(attempt), true
	case codes.ResourceExhausted:
		return ri, hasRI
	}
	return 0, false
}

// opName is the RPC's short name: "/decodeplane.v1.Rooms/GetRoom" → "GetRoom".
func opName(method string) string {
	return method[strings.LastIndexByte(method, '/')+1:]
}

// wait sleeps d before attempt n+1 of op. It returns last at once when ctx's
// deadline comes before the retry would (the retry could not succeed, and
// last says more than a deadline), or an *Error for ctx's end while waiting.
func wait(ctx context.Context, op string, d time.Duration, last *Error) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return last
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		st := status.FromContextError(ctx.Err())
		return newError(op, status.New(st.Code(), fmt.Sprintf("%s while waiting to retry after: %s", st.Message(), last.Message())))
	}
}

// invoke runs one unary RPC under the client's retry policy and returns its
// answer or an *Error.
func invoke[Req any, Resp any](ctx context.Context, c *Client, method string, req Req,
	call func(context.Context, Req, ...grpc.CallOption) (Resp, error)) (Resp, error) {
	op := opName(method)
	if err := c.errIfClosed(op); err != nil {
		var zero Resp
		return zero, err
	}
	again := retryable(method, req)
	for attempt := 1; ; attempt++ {
		resp, err := call(ctx, req, c.callOpts...)
		if err == nil {
			return resp, nil
		}
		e := toError(op, err)
		if !again || attempt >= c.retry.MaxAttempts {
			return resp, e
		}
		d, ok := c.retry.retryDelay(e.st, attempt)
		if !ok {
			return resp, e
		}
		if werr := wait(ctx, op, d, e); werr != nil {
			return resp, werr
		}
	}
}

package ops

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	"github.com/decodeplane/decodeplane/transfer"
)

// errorCodes maps domain errors to gRPC codes, checked in order with errors.Is.
var errorCodes = []struct {
	err  error
	code codes.Code
}{
	{prealloc.ErrExceedsCapacity, codes.InvalidArgument},
	{prealloc.ErrQueueFull, codes.ResourceExhausted},
	{kvmanager.ErrTooManyWaiters, codes.ResourceExhausted},
	{prealloc.ErrNoCapacity, codes.ResourceExhausted},
	{kvmanager.ErrSlowConsumer, codes.ResourceExhausted},
	{kvmanager.ErrDraining, codes.Unavailable},
	{kvmanager.ErrRegistryUnavailable, codes.Unavailable},
	{prealloc.ErrDraining, codes.Unavailable},
	{transfer.ErrEngineUnavailable, codes.Unavailable},
	{kvmanager.ErrRoomNotFound, codes.NotFound},
	{kvmanager.ErrPrefillNotFound, codes.NotFound},
	{kvmanager.ErrRoomExists, codes.AlreadyExists},
	{kvmanager.ErrPrefillMismatch, codes.FailedPrecondition},
	{kvmanager.ErrWrongState, codes.FailedPrecondition},
	{kvmanager.ErrDPRankConflict, codes.FailedPrecondition},
	{kvmanager.ErrStagingUnavailable, codes.FailedPrecondition},
	{kvmanager.ErrStagingNotWritable, codes.FailedPrecondition},
	{prealloc.ErrCannotResume, codes.FailedPrecondition},
	{kvmanager.ErrEngineOwnsPages, codes.FailedPrecondition},
	{kvmanager.ErrHeld, codes.FailedPrecondition},
	{prealloc.ErrOwned, codes.FailedPrecondition},         // resync.go
	{kvmanager.ErrResyncClosed, codes.FailedPrecondition}, // resync.go
	{transfer.ErrTransferFailed, codes.Aborted},
}

// Status is the one place where errors become gRPC statuses (for every
// transport; the HTTP routes map them on). Unknown errors become Internal
// with a generic message; the real error is logged (through the table's
// storm logger).
func (t *Table) Status(ctx context.Context, err error) error { return t.status(ctx, err) }

// toStatus maps err; unexpected reports an unknown error.
func toStatus(ctx context.Context, err error, unexpected func(context.Context, error)) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return status.FromContextError(err).Err()
	}
	var inv *kvmanager.InvalidError
	if errors.As(err, &inv) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	var capErr *prealloc.CapacityError
	if errors.As(err, &capErr) {
		return status.Error(codes.InvalidArgument, capErr.Error())
	}
	var stgErr *kvmanager.StagingError
	if errors.As(err, &stgErr) {
		return status.Error(codes.FailedPrecondition, stgErr.Error()) // SGLang's exact text
	}
	if errors.Is(err, kvmanager.ErrStagingTooLarge) {
		return status.Error(codes.ResourceExhausted, err.Error()) // no RetryInfo: it can never fit
	}
	var held *prealloc.HeldError
	if errors.As(err, &held) {
		return heldStatus(err, held)
	}
	for _, e := range errorCodes {
		if errors.Is(err, e.err) {
			st := status.New(e.code, err.Error())
			if e.code == codes.ResourceExhausted || e.code == codes.Unavailable {
				st = withRetry(st, err)
			}
			return st.Err()
		}
	}
	unexpected(ctx, err)
	return status.Error(codes.Internal, "internal error (logged by the daemon)")
}

// ReasonPageHeld is the ErrorInfo reason of a declaration refused because
// a page, row or slot it names is still held by another room's hand-off
// (DeclareDestination); its metadata name the index ("what", "index") and
// the holder ("holder", and "draining" when the holder failed and drains).
const ReasonPageHeld = "PAGE_HELD"

func heldStatus(err error, h *prealloc.HeldError) error {
	st := status.New(codes.FailedPrecondition, err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: ReasonPageHeld, Domain: ErrorDomain, Metadata: map[string]string{
		"what": h.What, "index": strconv.Itoa(int(h.Index)), "holder": strconv.FormatUint(h.Holder, 10), "draining": strconv.FormatBool(h.Draining),
	}}); derr == nil {
		return d.Err()
	}
	return st.Err()
}

// withRetry attaches a RetryInfo so clients back off instead of hammering.
func withRetry(st *status.Status, err error) *status.Status {
	delay := defaultRetryAfter
	var re *kvmanager.RetryError
	if errors.As(err, &re) && re.RetryAfter > 0 {
		delay = re.RetryAfter
	}
	if d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)}); derr == nil {
		return d
	}
	return st
}

// defaultRetryAfter is the retry hint when the domain gives none.
const defaultRetryAfter = time.Second

// status is Status.
func (t *Table) status(ctx context.Context, err error) error {
	return toStatus(ctx, err, func(ctx context.Context, err error) {
		t.storm.Log(ctx, slog.LevelError, "unexpected error", nil, "", slog.Any("err", err))
	})
}

// ContextStatus is status.FromContextError(err).Err(), made once for the
// two context errors: a watch or claim stream the client cancels (as the
// decode engine does once its room succeeded) ends without allocating.
func ContextStatus(err error) error {
	switch err {
	case context.Canceled:
		return errCanceled
	case context.DeadlineExceeded:
		return errDeadline
	}
	return status.FromContextError(err).Err()
}

var (
	errCanceled = status.FromContextError(context.Canceled).Err()
	errDeadline = status.FromContextError(context.DeadlineExceeded).Err()
)

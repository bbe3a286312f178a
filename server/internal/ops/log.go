package ops

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Logs and panics, as every transport reports them: a call or an op that
// failed is logged at its code's level (CallLevel) and a panic is INTERNAL
// with a generic message, its value and stack logged. All of them go
// through the table's storm logger (internal/stormlog): what fails many
// calls at once (a prefill lost while its ranks keep reporting chunks, a
// full admission queue, a bug every request hits) writes one line per
// cause per interval — the first at once, then a summary with the count —
// not one line per call. A failed call's cause is its service, method and
// code; a panic's and an unexpected error's, where it happened.

// CallLevel logs successful calls at debug (the control path is hot) and
// failures by severity.
func CallLevel(code codes.Code) logging.Level {
	switch code {
	case codes.OK, codes.NotFound, codes.Canceled, codes.AlreadyExists:
		return logging.LevelDebug
	case codes.InvalidArgument, codes.FailedPrecondition, codes.ResourceExhausted, codes.Unauthenticated,
		codes.PermissionDenied, codes.Unavailable, codes.Aborted, codes.DeadlineExceeded, codes.OutOfRange:
		return logging.LevelWarn
	}
	return logging.LevelError
}

// LogFailed logs a failed call (or session op: method is then the
// session's method and the op, "/decodeplane.v1.EngineSession/Session/open")
// as go-grpc-middleware's logger logs a finished call, at CallLevel's level.
func (t *Table) LogFailed(ctx context.Context, method, kind string, start time.Time, err error) {
	st, _ := status.FromError(err)
	lvl := slog.Level(CallLevel(st.Code()))
	if !t.log.Enabled(ctx, lvl) {
		return
	}
	service, name, _ := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	t.storm.Log(ctx, lvl, "finished call", []slog.Attr{slog.String("protocol", "grpc"), slog.String("grpc.component", "server"),
		slog.String("grpc.service", service), slog.String("grpc.method", name), slog.String("grpc.method_type", kind),
		slog.String("grpc.code", st.Code().String())}, "",
		slog.String("grpc.error", st.Message()), slog.Int64("grpc.time_ms", time.Since(start).Milliseconds()))
}

// Recovered is a recovered panic's answer: INTERNAL without details, the
// panic and its stack logged.
func (t *Table) Recovered(ctx context.Context, p any) error {
	t.Panicked(ctx, "panic in gRPC handler", nil, p)
	return status.Error(codes.Internal, "internal error (logged by the daemon)")
}

// Panicked logs a recovered panic (msg, where: the cause) with its value and
// stack.
func (t *Table) Panicked(ctx context.Context, msg string, where []slog.Attr, p any) {
	t.storm.Log(ctx, slog.LevelError, msg, where, "", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
}

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
// with a generic message, its value and stack logged.

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
	t.log.Log(ctx, lvl, "finished call", "protocol", "grpc", "grpc.component", "server",
		"grpc.service", service, "grpc.method", name, "grpc.method_type", kind,
		"grpc.code", st.Code().String(), "grpc.error", st.Message(), "grpc.time_ms", time.Since(start).Milliseconds())
}

// Recovered is a recovered panic's answer: INTERNAL without details, the
// panic and its stack logged.
func (t *Table) Recovered(ctx context.Context, p any) error {
	t.log.ErrorContext(ctx, "panic in gRPC handler", "panic", p, "stack", string(debug.Stack()))
	return status.Error(codes.Internal, "internal error (logged by the daemon)")
}

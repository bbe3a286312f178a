// Package telemetry builds what decodeplane's processes report through: the
// slog logger (text or JSON, trace ids on every record logged with a span)
// and the OpenTelemetry tracer provider from the standard OTEL_* variables
// (OTLP over gRPC, or no-op), validated so that a malformed variable is a
// startup error rather than silently ignored.
package telemetry

import (
	"context"
	"io"
	"log/slog"

	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/internal/config"
)

// NewLogger builds the daemon's slog logger: text or JSON, at the configured
// level, adding trace_id and span_id to every record logged with a context
// that carries a span.
func NewLogger(w io.Writer, cfg config.LogConfig) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.Level)) // validated before
	opts := &slog.HandlerOptions{Level: lvl}
	var h slog.Handler
	if cfg.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	} else {
		h = slog.NewTextHandler(w, opts)
	}
	return slog.New(traceHandler{h})
}

// traceHandler adds the span context of the record's context.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(a)}
}
func (h traceHandler) WithGroup(n string) slog.Handler { return traceHandler{h.Handler.WithGroup(n)} }

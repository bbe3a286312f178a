package bench

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/internal/telemetry"
)

// benchTracing is the bench's own tracer: its client spans (the simulated
// router, decode engine and prefill fleet) as service decodeplane-bench.
type benchTracing struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
	// tracer starts each room's root span; nil when tracing is off.
	tracer    trace.Tracer
	shutdown  func(context.Context) error
	exporting string
}

// benchNewTracing builds the bench's tracer from the same OTEL_* variables,
// validated as the daemon validates them (a malformed one is a usage error).
func benchNewTracing(ctx context.Context, environ []string, version string) (*benchTracing, error) {
	tr, err := telemetry.NewTracing(ctx, environ, telemetry.As{Service: "decodeplane-bench", Fixed: true, Component: "bench", Version: version})
	if err != nil {
		return nil, err
	}
	bt := &benchTracing{provider: tr.Provider, propagator: tr.Propagator, shutdown: tr.Shutdown, exporting: tr.Exporting}
	if tr.Exporting != "" {
		bt.tracer = tr.Provider.Tracer("github.com/decodeplane/decodeplane/cmd/decodeplane/bench")
	}
	return bt, nil
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
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
func benchNewTracing(ctx context.Context, environ []string) (*benchTracing, error) {
	env := otelEnv{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "OTEL_") {
			env[k] = v
		}
	}
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	enabled, endpoint, errs := checkOTelEnv(env)
	if len(errs) > 0 {
		return nil, &usageError{fmt.Errorf("tracing configuration: %w", errors.Join(errs...))}
	}
	if !enabled {
		return &benchTracing{provider: noop.NewTracerProvider(), propagator: prop, shutdown: func(context.Context) error { return nil }}, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, &usageError{fmt.Errorf("tracing: OTLP exporter: %w", err)}
	}
	res, err := resource.New(ctx,
		resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(),
		// After WithFromEnv: an OTEL_SERVICE_NAME meant for the daemon does
		// not rename the bench.
		resource.WithAttributes(semconv.ServiceName("decodeplane-bench"), semconv.ServiceVersion(version),
			attribute.String("decodeplane.component", "bench")),
	)
	if err != nil {
		return nil, &usageError{fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES: %w", err)}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &benchTracing{
		provider: tp, propagator: prop, tracer: tp.Tracer("github.com/decodeplane/decodeplane/cmd/decodeplane/bench"),
		shutdown: tp.Shutdown, exporting: endpoint,
	}, nil
}

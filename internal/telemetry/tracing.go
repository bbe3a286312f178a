package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
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

// tracing is the daemon's OpenTelemetry setup.
type tracing struct {
	provider   trace.TracerProvider
	propagator propagation.TextMapPropagator
	shutdown   func(context.Context) error
	exporting  string // where spans go, for the startup log ("" = off)
}

// otelEnv reads the standard OTEL_* variables from environ.
type otelEnv map[string]string

func (e otelEnv) get(names ...string) (string, string) {
	for _, n := range names {
		if v, ok := e[n]; ok && strings.TrimSpace(v) != "" {
			return n, strings.TrimSpace(v)
		}
	}
	return "", ""
}

// checkOTelEnv validates the OTEL_* settings the SDK would otherwise ignore
// silently when malformed, and returns every problem at once.
func checkOTelEnv(env otelEnv) (enabled bool, endpoint string, errs []error) {
	bad := func(name, val, why string) {
		errs = append(errs, fmt.Errorf("env %s=%q: %s", name, val, why))
	}
	if n, v := env.get("OTEL_SDK_DISABLED"); n != "" {
		if b, err := strconv.ParseBool(v); err != nil {
			bad(n, v, "not a boolean (true or false)")
		} else if b {
			return false, "", errs
		}
	}
	exporter := "otlp"
	if n, v := env.get("OTEL_TRACES_EXPORTER"); n != "" {
		switch v {
		case "otlp", "none":
			exporter = v
		default:
			bad(n, v, "decodeplane exports traces with otlp (or none to turn them off)")
		}
	}
	n, ep := env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	if n != "" {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(n, ep, "not an http:// or https:// URL with a host, e.g. http://127.0.0.1:4317 (Jaeger's OTLP gRPC port)")
		} else if u.Port() != "" {
			if p, err := strconv.Atoi(u.Port()); err != nil || p <= 0 || p > 65535 {
				bad(n, ep, "has an invalid port")
			}
		}
	}
	if n, v := env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"); n != "" && v != "grpc" {
		bad(n, v, "decodeplane exports OTLP over gRPC; set grpc (Jaeger listens on 4317 for it)")
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"} {
		if n, v := env.get(name); n != "" {
			if i, err := strconv.Atoi(v); err != nil || i < 0 {
				bad(n, v, "not a non-negative integer")
			}
		}
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_INSECURE", "OTEL_EXPORTER_OTLP_TRACES_INSECURE"} {
		if n, v := env.get(name); n != "" {
			if _, err := strconv.ParseBool(v); err != nil {
				bad(n, v, "not a boolean (true or false)")
			}
		}
	}
	if n, v := env.get("OTEL_TRACES_SAMPLER"); n != "" {
		switch v {
		case "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio":
		default:
			bad(n, v, "allowed: always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio")
		}
	}
	if n, v := env.get("OTEL_TRACES_SAMPLER_ARG"); n != "" {
		if f, err := strconv.ParseFloat(v, 64); err != nil || f < 0 || f > 1 {
			bad(n, v, "a sampling ratio between 0 and 1")
		}
	}
	if n, v := env.get("OTEL_RESOURCE_ATTRIBUTES"); n != "" {
		for _, kv := range strings.Split(v, ",") {
			if k, _, ok := strings.Cut(kv, "="); !ok || strings.TrimSpace(k) == "" {
				bad(n, v, "want key=value pairs separated by commas")
				break
			}
		}
	}
	if n, v := env.get("OTEL_PROPAGATORS"); n != "" {
		for _, p := range strings.Split(v, ",") {
			switch strings.TrimSpace(p) {
			case "tracecontext", "baggage", "none":
			default:
				bad(n, v, "decodeplane propagates W3C tracecontext and baggage")
			}
		}
	}
	enabled = exporter == "otlp" && (ep != "" || env["OTEL_TRACES_EXPORTER"] == "otlp")
	if enabled && ep == "" {
		ep = "http://localhost:4317"
	}
	return enabled, ep, errs
}

// tracedAs names the process in its traces.
type tracedAs struct {
	// service is the service.name; OTEL_SERVICE_NAME overrides it unless
	// fixed is set (the bench must not take a name meant for the daemon).
	service   string
	fixed     bool
	component string
}

// newTracing builds the tracer provider from the OTEL_* variables: OTLP over
// gRPC (Jaeger's port 4317) when an endpoint is set, otherwise no-op. A
// malformed setting is a startup error (exit 2).
func newTracing(ctx context.Context, environ []string, as tracedAs) (*tracing, error) {
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
		return &tracing{provider: noop.NewTracerProvider(), propagator: prop, shutdown: func(context.Context) error { return nil }}, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, &usageError{fmt.Errorf("tracing: OTLP exporter: %w", err)}
	}
	name := []attribute.KeyValue{semconv.ServiceName(as.service), semconv.ServiceVersion(version)}
	opts := []resource.Option{resource.WithAttributes(name...), resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost()}
	if as.fixed {
		opts = append(opts, resource.WithAttributes(name...)) // after WithFromEnv: it wins
	}
	opts = append(opts, resource.WithAttributes(attribute.String("decodeplane.component", as.component)))
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, &usageError{fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES/OTEL_SERVICE_NAME: %w", err)}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &tracing{provider: tp, propagator: prop, shutdown: tp.Shutdown, exporting: endpoint}, nil
}

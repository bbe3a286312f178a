package telemetry

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

	"github.com/decodeplane/decodeplane/internal/config"
)

// Tracing is a process's OpenTelemetry setup.
type Tracing struct {
	Provider   trace.TracerProvider
	Propagator propagation.TextMapPropagator
	// Shutdown flushes and stops the exporter.
	Shutdown func(context.Context) error
	// Exporting is where spans go, for the startup log ("" = off).
	Exporting string
}

// otelEnv reads the standard OTEL_* variables from environ.
type otelEnv map[string]string

// envOf collects the OTEL_* variables of environ.
func envOf(environ []string) otelEnv {
	env := otelEnv{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "OTEL_") {
			env[k] = v
		}
	}
	return env
}

// CheckEnv returns every problem of the OTEL_* variables in environ (what
// NewTracing would refuse), for decodeplane validate.
func CheckEnv(environ []string) []error {
	_, _, errs := checkOTelEnv(envOf(environ))
	return errs
}

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

// As names the process in its traces.
type As struct {
	// service is the service.name; OTEL_SERVICE_NAME overrides it unless
	// fixed is set (the bench must not take a name meant for the daemon).
	Service   string
	Fixed     bool
	Component string
	// Version is the service.version.
	Version string
}

// NewTracing builds the tracer provider from the OTEL_* variables: OTLP over
// gRPC (Jaeger's port 4317) when an endpoint is set, otherwise no-op. A
// malformed setting is a startup error (exit 2).
func NewTracing(ctx context.Context, environ []string, as As) (*Tracing, error) {
	env := envOf(environ)
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	enabled, endpoint, errs := checkOTelEnv(env)
	if len(errs) > 0 {
		return nil, &config.UsageError{Err: fmt.Errorf("tracing configuration: %w", errors.Join(errs...))}
	}
	if !enabled {
		return &Tracing{Provider: noop.NewTracerProvider(), Propagator: prop, Shutdown: func(context.Context) error { return nil }}, nil
	}
	exp, err := otlptracegrpc.New(ctx)
	if err != nil {
		return nil, &config.UsageError{Err: fmt.Errorf("tracing: OTLP exporter: %w", err)}
	}
	name := []attribute.KeyValue{semconv.ServiceName(as.Service), semconv.ServiceVersion(as.Version)}
	opts := []resource.Option{resource.WithAttributes(name...), resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost()}
	if as.Fixed {
		opts = append(opts, resource.WithAttributes(name...)) // after WithFromEnv: it wins
	}
	opts = append(opts, resource.WithAttributes(attribute.String("decodeplane.component", as.Component)))
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, &config.UsageError{Err: fmt.Errorf("tracing: resource from OTEL_RESOURCE_ATTRIBUTES/OTEL_SERVICE_NAME: %w", err)}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Tracing{Provider: tp, Propagator: prop, Shutdown: tp.Shutdown, Exporting: endpoint}, nil
}

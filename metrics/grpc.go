package metrics

import (
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// grpcMetrics are the gRPC server metrics of go-grpc-middleware's
// providers/prometheus (same names, help, labels and counting rules: a
// unary call counts one message received, and one sent when it succeeds; a
// stream counts each message it received or sent without error; the code is
// the status of the error, a context error as the server maps it), with the
// series of every registered method looked up once (InitializeGRPC) instead
// of by label values on every call and message.
type grpcMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec
	// methods is written by InitializeGRPC before the server serves and only
	// read afterwards.
	methods map[string]*GRPCMethod
}

// GRPCMethod is one method's series (it implements server.MethodMetrics;
// internal/daemon passes it to the server).
type GRPCMethod struct {
	started, received, sent prometheus.Counter
	handling                prometheus.Observer
	handled                 [codes.Unauthenticated + 1]prometheus.Counter
	// handledOther counts a code beyond the known ones.
	handledOther func(codes.Code)
}

func newGRPCMetrics() *grpcMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &grpcMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels[:3:3], "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total", Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total", Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: latencyBuckets,
		}, labels),
		methods: map[string]*GRPCMethod{},
	}
}

func (g *grpcMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.started, g.handled, g.received, g.sent, g.handling}
}

func methodType(clientStreams, serverStreams bool) string {
	switch {
	case !clientStreams && !serverStreams:
		return "unary"
	case clientStreams && !serverStreams:
		return "client_stream"
	case !clientStreams && serverStreams:
		return "server_stream"
	}
	return "bidi_stream"
}

// series makes (or finds) a method's series.
func (g *grpcMetrics) series(typ, service, method string) *GRPCMethod {
	mm := &GRPCMethod{
		started:  g.started.WithLabelValues(typ, service, method),
		received: g.received.WithLabelValues(typ, service, method),
		sent:     g.sent.WithLabelValues(typ, service, method),
		handling: g.handling.WithLabelValues(typ, service, method),
	}
	mm.handledOther = func(c codes.Code) { g.handled.WithLabelValues(typ, service, method, c.String()).Inc() }
	for c := range mm.handled {
		mm.handled[c] = g.handled.WithLabelValues(typ, service, method, codes.Code(c).String())
	}
	return mm
}

// initialize pre-registers every method of s at zero and caches its series.
func (g *grpcMetrics) initialize(s *grpc.Server) {
	for service, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			g.methods["/"+service+"/"+m.Name] = g.series(methodType(m.IsClientStream, m.IsServerStream), service, m.Name)
		}
	}
}

// lookup is a method's series: cached, or (a method registered after
// InitializeGRPC) by label values.
func (g *grpcMetrics) lookup(fullMethod, typ string) *GRPCMethod {
	if mm := g.methods[fullMethod]; mm != nil {
		return mm
	}
	service, method := splitMethod(fullMethod)
	return g.series(typ, service, method)
}

// splitMethod splits "/service/method" as go-grpc-middleware does.
func splitMethod(full string) (string, string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.Index(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", "unknown"
}

// Started counts a call started (server.MethodMetrics).
func (mm *GRPCMethod) Started() { mm.started.Inc() }

// Received counts a message received.
func (mm *GRPCMethod) Received() { mm.received.Inc() }

// Sent counts a message sent.
func (mm *GRPCMethod) Sent() { mm.sent.Inc() }

// Handled counts the call's end with its error's code (a context error as
// the server maps it) and observes its duration.
func (mm *GRPCMethod) Handled(err error, start time.Time) {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	c := st.Code()
	if int(c) < len(mm.handled) {
		mm.handled[c].Inc()
	} else {
		mm.handledOther(c)
	}
	mm.handling.Observe(time.Since(start).Seconds())
}

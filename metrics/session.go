package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// sessionMetrics count the ops of the decode engine's EngineSession
// streams (server.SessionMetrics); the streams themselves are the gRPC
// server metrics' (grpc.go).
type sessionMetrics struct {
	ops *prometheus.CounterVec
}

func newSessionMetrics() sessionMetrics {
	return sessionMetrics{ops: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_engine_session_ops_total",
		Help: "Ops of EngineSession streams by op (open, release, abort, watch: once per room of the op, once for an op refused as a whole; protocol: a violation that ended a stream) and gRPC code.",
	}, []string{"op", "code"})}
}

// EngineSessionOp implements server.SessionMetrics.
func (m *Metrics) EngineSessionOp(op string, code codes.Code) {
	m.session.ops.WithLabelValues(op, code.String()).Inc()
}

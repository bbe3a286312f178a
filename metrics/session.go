package metrics

import (
	"google.golang.org/grpc/codes"

	"github.com/prometheus/client_golang/prometheus"
)

// Prefill sessions (server/prefill_session.go): each op a session carried,
// by op and result code. The stream itself is counted by the gRPC server
// metrics (decodeplane.v1.PrefillSession/Session); an op refused inside a
// session is not a failed call there, so it is counted here.

func newSessionOps() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_prefill_session_ops_total",
		Help: "Ops carried by prefill sessions (PrefillSession.Session), by op (hello, ping, claim, chunk, report, ack, unknown) and result code.",
	}, []string{"op", "code"})
}

// SessionOp counts one op of a prefill session (server.SessionMetrics).
func (m *Metrics) SessionOp(op string, code codes.Code) {
	m.sessionOps.WithLabelValues(op, code.String()).Inc()
}

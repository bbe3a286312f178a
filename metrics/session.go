package metrics

import (
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/prometheus/client_golang/prometheus"
)

// Prefill sessions (server/prefill_session.go): each op a session carried,
// by op and result code. The stream itself is counted by the gRPC server
// metrics (decodeplane.v1.PrefillSession/Session); an op refused inside a
// session is not a failed call there, so it is counted here.

// sessionOpNames are the op label's values, in index order.
var sessionOpNames = [...]string{"hello", "ping", "claim", "chunk", "report", "ack", "unknown"}

// maxCode bounds the gRPC codes a series is kept for (codes.Unauthenticated
// is the last defined one); others count as Unknown.
const maxCode = int(codes.Unauthenticated) + 1

// sessionOps is the counter, with each (op, code) child looked up once, on
// its first use.
type sessionOps struct {
	vec *prometheus.CounterVec
	mu  sync.Mutex
	c   [len(sessionOpNames)][maxCode]prometheus.Counter
}

func newSessionOps() *sessionOps {
	return &sessionOps{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_prefill_session_ops_total",
		Help: "Ops carried by prefill sessions (PrefillSession.Session), by op (hello, ping, claim, chunk, report, ack, unknown) and result code.",
	}, []string{"op", "code"})}
}

// SessionOp counts one op of a prefill session (server.SessionMetrics).
func (m *Metrics) SessionOp(op string, code codes.Code) {
	i := len(sessionOpNames) - 1
	for j, n := range sessionOpNames {
		if n == op {
			i = j
			break
		}
	}
	k := int(code)
	if k < 0 || k >= maxCode {
		code, k = codes.Unknown, int(codes.Unknown)
	}
	s := m.sessionOps
	s.mu.Lock()
	c := s.c[i][k]
	if c == nil {
		c = s.vec.WithLabelValues(sessionOpNames[i], code.String())
		s.c[i][k] = c
	}
	s.mu.Unlock()
	c.Inc()
}

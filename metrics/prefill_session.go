package metrics

import (
	"sync"

	"google.golang.org/grpc/codes"

	"github.com/prometheus/client_golang/prometheus"
)

// Prefill sessions (server/internal/session/prefill.go): each op a session carried,
// by op and result code. The stream itself is counted by the gRPC server
// metrics (decodeplane.v1.PrefillSession/Session); an op refused inside a
// session is not a failed call there, so it is counted here.

// prefillSessionOpNames are the op label's values, in index order.
var prefillSessionOpNames = [...]string{"hello", "ping", "claim", "chunk", "report", "ack", "offer", "unknown"}

// maxSessionCode bounds the gRPC codes a series is kept for (codes.Unauthenticated
// is the last defined one); others count as Unknown.
const maxSessionCode = int(codes.Unauthenticated) + 1

// prefillSessionOps is the counter, with each (op, code) child looked up once, on
// its first use.
type prefillSessionOps struct {
	vec *prometheus.CounterVec
	mu  sync.Mutex
	c   [len(prefillSessionOpNames)][maxSessionCode]prometheus.Counter
}

func newPrefillSessionOps() *prefillSessionOps {
	return &prefillSessionOps{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "decodeplane_prefill_session_ops_total",
		Help: "Ops carried by prefill sessions (PrefillSession.Session), by op (hello, ping, claim, chunk, report, ack, offer: a room the daemon claimed for the session's rank, unknown) and result code.",
	}, []string{"op", "code"})}
}

// PrefillSessionOp counts one op of a prefill session
// (server.PrefillSessionMetrics).
func (m *Metrics) PrefillSessionOp(op string, code codes.Code) {
	i := len(prefillSessionOpNames) - 1
	for j, n := range prefillSessionOpNames {
		if n == op {
			i = j
			break
		}
	}
	k := int(code)
	if k < 0 || k >= maxSessionCode {
		code, k = codes.Unknown, int(codes.Unknown)
	}
	s := m.prefillSessionOps
	s.mu.Lock()
	c := s.c[i][k]
	if c == nil {
		c = s.vec.WithLabelValues(prefillSessionOpNames[i], code.String())
		s.c[i][k] = c
	}
	s.mu.Unlock()
	c.Inc()
}

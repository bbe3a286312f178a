package metrics_test

import (
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/decodeplane/decodeplane/metrics"
)

// TestEngineSessionOps: the server's session op counts reach /metrics by op
// and code.
func TestEngineSessionOps(t *testing.T) {
	m := metrics.New()
	d := &metricsDaemon{metrics: m}
	var sm interface{ EngineSessionOp(string, codes.Code) } = m // server.SessionMetrics
	sm.EngineSessionOp("open", codes.OK)
	sm.EngineSessionOp("open", codes.OK)
	sm.EngineSessionOp("open", codes.InvalidArgument)
	sm.EngineSessionOp("protocol", codes.InvalidArgument)
	fams := d.scrape(t)
	for _, tc := range []struct {
		op, code string
		want     float64
	}{{"open", "OK", 2}, {"open", "InvalidArgument", 1}, {"protocol", "InvalidArgument", 1}} {
		if v := value(fams, "decodeplane_engine_session_ops_total", map[string]string{"op": tc.op, "code": tc.code}); v != tc.want {
			t.Errorf("ops{op=%s,code=%s} = %v, want %v", tc.op, tc.code, v, tc.want)
		}
	}
}

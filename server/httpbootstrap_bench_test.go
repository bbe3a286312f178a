package server_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// BenchmarkHTTPBootstrapHandlers measures the route handlers alone (no
// socket), for profiling; TestHTTPBench in cmd/decodeplane measures the
// daemon end to end.
func BenchmarkHTTPBootstrapHandlers(b *testing.B) {
	hb := newHTTPBoot(b, "bench")
	auth := "Bearer bench"
	for dp := range 2 {
		if code, body, _ := hb.do(b, "PUT", "/route", auth, putBody(1, 0, 2, dp, "10.0.0.1", 17000+dp, 16, "bf16", "round_robin", 30000)); code != 200 {
			b.Fatal(code, body)
		}
	}
	var rooms []string
	for i := range 64 {
		rooms = append(rooms, fmt.Sprint(1000+i))
		hb.do(b, "POST", "/register_dp_rank", auth, fmt.Sprintf(`{"bootstrap_room": %d, "dp_rank": %d}`, 1000+i, i%2))
	}
	mux := http.NewServeMux()
	hb.bh.Register(mux)
	for _, c := range []struct{ name, method, path, body string }{
		{"register_dp_rank", "POST", "/register_dp_rank", `{"bootstrap_room": 5, "dp_rank": 1}`},
		{"query_1", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [1001]}`},
		{"query_64", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [` + strings.Join(rooms, ", ") + `]}`},
		{"get_route", "GET", "/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", ""},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := httptest.NewRequest(c.method, "http://"+hb.host+c.path, strings.NewReader(c.body))
				req.Header.Set("Authorization", auth)
				w := httptest.NewRecorder()
				mux.ServeHTTP(w, req)
				if w.Code != 200 {
					b.Fatal(w.Code, w.Body.String())
				}
			}
		})
	}
}

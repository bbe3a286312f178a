package server_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
	"github.com/decodeplane/decodeplane/server/internal/pipenet"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// SGLang's bootstrap routes over real HTTP on loopback, spoken the way
// SGLang's Python side speaks them: module-level requests.put/get/post, so a
// new TCP connection per call, JSON written by json.dumps.

const httpToken = "tok-3f9a"

type httpBoot struct {
	srv    *server.Server
	m      *kvmanager.Manager
	bh     *server.BootstrapHTTP
	boot   pb.BootstrapClient
	url    string // http://127.0.0.1:port
	host   string // its host:port, the bare routes' instance
	client *http.Client
}

func newManager(tb testing.TB, decodeTP int, mod func(*kvmanager.Config)) (*kvmanager.Manager, kvlayout.Config) {
	tb.Helper()
	dec := stgDecodeConfig(decodeTP)
	dec.Staging = kvlayout.StagingConfig{}
	led, err := prealloc.NewLedger(dec, 0)
	if err != nil {
		tb.Fatal(err)
	}
	kcfg := kvmanager.DefaultConfig()
	kcfg.Timeouts.HeartbeatInterval = time.Hour
	if mod != nil {
		mod(&kcfg)
	}
	m, err := kvmanager.New(kcfg, dec, kvmanager.Deps{Ledgers: []*prealloc.Ledger{led}, Engine: sim.NewSimEngine(sim.SimConfig{}, nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	return m, dec
}

func newHTTPBoot(tb testing.TB, token string) *httpBoot {
	tb.Helper()
	m, dec := newManager(tb, 2, nil)
	cfg := server.DefaultConfig()
	cfg.AuthToken = token
	srv, err := server.New(cfg, server.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Layout: dec.Layout(), TransferPath: "sim", Manager: m})
	if err != nil {
		tb.Fatal(err)
	}
	srv.SetReady(true, "serving")
	bh, err := srv.NewBootstrapHTTP(server.BootstrapHTTPOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	mux := http.NewServeMux()
	bh.Register(mux)
	hs := httptest.NewServer(mux)
	lis := bufconn.Listen(1 << 20)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		tb.Fatal(err)
	}
	tr := &http.Transport{DisableKeepAlives: true} // requests.put/get/post: a new connection per call
	b := &httpBoot{srv: srv, m: m, bh: bh, boot: pb.NewBootstrapClient(conn), url: hs.URL, host: strings.TrimPrefix(hs.URL, "http://"),
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
	tb.Cleanup(func() {
		tr.CloseIdleConnections()
		hs.Close()
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx, m.Shutdown); err != nil {
			tb.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			tb.Errorf("Serve: %v", err)
		}
		lis.Close()
	})
	return b
}

// do sends one request as python-requests does and returns the status,
// the body and the Content-Type.
func (b *httpBoot) do(tb testing.TB, method, path, auth, body string) (int, string, string) {
	tb.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, b.url+path, rd)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("User-Agent", "python-requests/2.32.3")
	req.Header.Set("Accept-Encoding", "gzip, deflate")
	req.Header.Set("Accept", "*/*")
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := b.client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, string(out), resp.Header.Get("Content-Type")
}

func (b *httpBoot) want(tb testing.TB, method, path, auth, body string, wantCode int, wantBody string) {
	tb.Helper()
	code, got, _ := b.do(tb, method, path, auth, body)
	if code != wantCode || got != wantBody {
		tb.Errorf("%s %s %s = %d %q, want %d %q", method, path, body, code, got, wantCode, wantBody)
	}
}

func (b *httpBoot) wantPrefix(tb testing.TB, method, path, auth, body string, wantCode int, wantParts ...string) {
	tb.Helper()
	code, got, _ := b.do(tb, method, path, auth, body)
	ok := code == wantCode
	for _, p := range wantParts {
		ok = ok && strings.Contains(got, p)
	}
	if !ok {
		tb.Errorf("%s %s %s = %d %q, want %d containing %q", method, path, body, code, got, wantCode, wantParts)
	}
}

// putBody is a PUT /route body as json.dumps writes CommonKVManager's dict.
func putBody(tp, tpRank, dp, dpRank int, ip string, port, pageSize int, dtype, lb string, httpPort int) string {
	return fmt.Sprintf(`{"attn_tp_size": %d, "attn_tp_rank": %d, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": %d, "attn_dp_rank": %d, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": %q, "rank_port": %d, "page_size": %d, "kv_cache_dtype": %q, "load_balance_method": %q, "enable_dsa_cache_layer_split": false, "prefill_http_port": %d}`,
		tp, tpRank, dp, dpRank, ip, port, pageSize, dtype, lb, httpPort)
}

func TestHTTPBootstrapSGLangFlow(t *testing.T) {
	b := newHTTPBoot(t, httpToken)
	auth := "Bearer " + httpToken
	sentinel := "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"

	b.want(t, "GET", "/health", "", "", 200, "OK")
	b.want(t, "GET", sentinel, "", "", 503, "Prefill server not fully registered yet (0 workers registered).")
	// dp 2 × tp 2 = 4 ranks, round-robin DP balancing (bindings matter).
	type rk struct{ dp, tp int }
	ranks := []rk{{0, 0}, {0, 1}, {1, 0}, {1, 1}}
	for i, r := range ranks[:3] {
		b.want(t, "PUT", "/route", auth, putBody(2, r.tp, 2, r.dp, fmt.Sprintf("10.0.0.%d", i+1), 17000+i, 16, "bf16", "round_robin", 30000), 200, "OK")
	}
	b.want(t, "GET", sentinel, "", "", 503, "Prefill server not fully registered yet (3 workers registered).")
	b.want(t, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0", "", "", 503, "Prefill server not fully registered yet (3 workers registered).")
	// Registration is idempotent per rank (SGLang's sender retries 5×).
	b.want(t, "PUT", "/route", auth, putBody(2, 0, 2, 0, "10.0.0.1", 17000, 16, "bf16", "round_robin", 30000), 200, "OK")
	b.want(t, "PUT", "/route", auth, putBody(2, 1, 2, 1, "10.0.0.4", 17003, 16, "bf16", "round_robin", 30000), 200, "OK")

	code, body, ctype := b.do(t, "GET", sentinel, "", "")
	if want := `{"attn_tp_size": 2, "attn_cp_size": 1, "dp_size": 2, "pp_size": 1, "page_size": 16, "kv_cache_dtype": "bf16", "follow_bootstrap_room": false, "enable_dsa_cache_layer_split": false, "prefill_http_port": 30000}`; code != 200 || body != want || ctype != "application/json; charset=utf-8" {
		t.Errorf("sentinel GET /route = %d %q (%s), want 200 %q", code, body, ctype, want)
	}
	b.want(t, "GET", "/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=1&target_pp_rank=0", "", "", 200, `{"rank_ip": "10.0.0.4", "rank_port": 17003}`)
	b.want(t, "GET", "/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "", "", 200, `{"rank_ip": "10.0.0.3", "rank_port": 17002}`)
	b.want(t, "GET", "/route?prefill_dp_rank=2&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "", "", 404, "Bootstrap info not found for dp_rank=2 cp_rank=0 tp_rank=0 pp_rank=0")
	b.want(t, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=-1&target_tp_rank=0&target_pp_rank=0", "", "", 404, "Bootstrap info not found for dp_rank=0 cp_rank=-1 tp_rank=0 pp_rank=0")
	b.want(t, "GET", "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0", "", "", 400, "Missing inputs for bootstrap server.")
	b.want(t, "GET", "/route?prefill_dp_rank=x&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "", "", 400, `Bad request: prefill_dp_rank="x" is not an integer`)
	b.want(t, "POST", "/route", auth, "{}", 405, "Method not allowed")
	b.want(t, "DELETE", "/route", auth, "", 405, "Method not allowed")

	// register_dp_rank: writes need the token; reads stay open.
	room := uint64(7_000_000_000_000_000_001)
	bind := fmt.Sprintf(`{"bootstrap_room": %d, "dp_rank": 1}`, room)
	b.want(t, "POST", "/register_dp_rank", "", bind, 401, "Unauthorized")
	b.want(t, "POST", "/register_dp_rank", "Bearer wrong", bind, 401, "Unauthorized")
	b.want(t, "POST", "/register_dp_rank", "Basic "+httpToken, bind, 401, "Unauthorized")
	b.want(t, "PUT", "/route", "", putBody(2, 0, 2, 0, "10.0.0.1", 17000, 16, "bf16", "round_robin", 30000), 401, "Unauthorized")
	b.want(t, "POST", "/query_dp_ranks", "", fmt.Sprintf(`{"bootstrap_rooms": [%d]}`, room), 200, "{}")
	b.want(t, "POST", "/register_dp_rank", "bEaReR "+httpToken, bind, 200, "OK")
	b.want(t, "POST", "/query_dp_ranks", "", fmt.Sprintf(`{"bootstrap_rooms": [%d, 5, 6]}`, room), 200, fmt.Sprintf(`{"%d": 1}`, room))
	b.want(t, "POST", "/query_dp_ranks", "", `{"bootstrap_rooms": []}`, 200, "{}")
	b.wantPrefix(t, "POST", "/register_dp_rank", auth, `{"bootstrap_room": 5, "dp_rank": 2}`, 400, "dp_rank: 2 is out of range", "has dp_size 2 (allowed 0..1)")

	// Interleaving with gRPC through the same registry: a gRPC binding is
	// answered over HTTP, an HTTP binding over gRPC.
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", auth)
	if _, err := b.boot.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: b.host, Room: 6, DpRank: 0}); err != nil {
		t.Fatal(err)
	}
	b.want(t, "POST", "/query_dp_ranks", "", fmt.Sprintf(`{"bootstrap_rooms": [6, %d]}`, room), 200, fmt.Sprintf(`{"6": 0, "%d": 1}`, room))
	lk, err := b.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: b.host, Rooms: []uint64{room}})
	if err != nil || len(lk.GetResolved()) != 1 || lk.GetResolved()[0].GetDpRank() != 1 || lk.GetResolved()[0].GetRule() != pb.DPRankRule_DP_RANK_RULE_BINDING {
		t.Errorf("gRPC LookupDPRanks of an HTTP binding = %v, %v", lk, err)
	}
	// A gRPC-registered instance is visible through the alias routes, and an
	// HTTP rank of it through gRPC's GetStatus-free paths (LookupDPRanks).
	other := "10.9.9.9:8998"
	if _, err := b.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: other, RankEndpoint: "10.9.9.9:17100",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16", PrefillHttpPort: 31000}); err != nil {
		t.Fatal(err)
	}
	b.want(t, "GET", "/instances/"+other+sentinel, "", "", 200, `{"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 16, "kv_cache_dtype": "bf16", "follow_bootstrap_room": true, "enable_dsa_cache_layer_split": false, "prefill_http_port": 31000}`)
	b.want(t, "GET", "/instances/"+other+"/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "", "", 200, `{"rank_ip": "10.9.9.9", "rank_port": 17100}`)
	b.want(t, "GET", "/instances/10.1.1.1:1/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0", "", "", 503, "Prefill server not fully registered yet (0 workers registered).")
	// An HTTP PUT through the alias joins a gRPC-registered instance's registry.
	third := "10.8.8.8:8998"
	b.want(t, "PUT", "/instances/"+third+"/route", auth, putBody(1, 0, 1, 0, "10.8.8.8", 17200, 16, "bf16", "", 30001), 200, "OK")
	lk, err = b.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: third, Rooms: []uint64{9}})
	if err != nil || len(lk.GetResolved()) != 1 {
		t.Errorf("gRPC LookupDPRanks of an HTTP-registered instance = %v, %v", lk, err)
	}
	if got := b.bh.Polled(); len(got) != 2 {
		t.Errorf("polled instances = %v, want the two HTTP-registered ones", got)
	}
}

func TestHTTPBootstrapBadInput(t *testing.T) {
	b := newHTTPBoot(t, "")
	ok := putBody(1, 0, 1, 0, "10.0.0.1", 17000, 16, "bf16", "", 30000)
	b.want(t, "PUT", "/route", "", ok, 200, "OK")
	cases := []struct {
		name, method, path, body string
		code                     int
		parts                    []string
	}{
		{"negative rank", "PUT", "/route", strings.Replace(ok, `"attn_tp_rank": 0`, `"attn_tp_rank": -1`, 1), 400, []string{"attn_tp_rank: -1 is out of range"}},
		{"string for an int", "PUT", "/route", strings.Replace(ok, `"rank_port": 17000`, `"rank_port": "17000"`, 1), 400, []string{"rank_port", "string"}},
		{"float for an int", "PUT", "/route", strings.Replace(ok, `"page_size": 16`, `"page_size": 16.5`, 1), 400, []string{"page_size"}},
		{"rank outside its size", "PUT", "/route", strings.Replace(ok, `"attn_tp_rank": 0`, `"attn_tp_rank": 3`, 1), 400, []string{"attn_tp_rank: 3 is out of range: attn_tp_size is 1"}},
		{"no rank_ip", "PUT", "/route", strings.Replace(ok, `"rank_ip": "10.0.0.1"`, `"rank_ip": ""`, 1), 400, []string{"rank_ip: is required"}},
		{"no http port", "PUT", "/route", strings.Replace(ok, `"prefill_http_port": 30000`, `"prefill_http_port": 0`, 1), 400, []string{"prefill_http_port: 0 is not a port"}},
		{"every problem at once", "PUT", "/route", `{"attn_tp_size": 0, "pp_size": 0, "rank_port": 0}`, 400, []string{"attn_tp_size: must be >= 1", "pp_size: must be >= 1", "rank_port", "page_size", "kv_cache_dtype: is required"}},
		{"page size mismatch", "PUT", "/instances/10.0.0.2:8998/route", strings.Replace(ok, `"page_size": 16`, `"page_size": 32`, 1), 400, []string{"Page size mismatch: prefill server has page_size=32, but decode server has page_size=16"}},
		{"dtype mismatch", "PUT", "/instances/10.0.0.2:8998/route", strings.Replace(ok, `"bf16"`, `"fp8_e4m3"`, 1), 400, []string{"KV cache dtype mismatch"}},
		{"contradicting layout", "PUT", "/route", putBody(2, 1, 1, 0, "10.0.0.1", 17001, 16, "bf16", "", 30000), 400, []string{"registered attn_tp=1"}},
		{"not JSON", "PUT", "/route", `attn_tp_size=1`, 400, []string{"not JSON"}},
		{"empty body", "POST", "/register_dp_rank", ``, 400, []string{"empty"}},
		{"huge body", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [` + strings.Repeat("1, ", 400_000) + `1]}`, 400, []string{"larger than 1048576 bytes"}},
		{"room beyond 2^63-1", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [9223372036854775808]}`, 400, []string{"rooms[0]: 9223372036854775808 is out of range"}},
		{"negative room", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [-1]}`, 400, []string{"bootstrap_rooms"}},
		{"too many rooms", "POST", "/query_dp_ranks", `{"bootstrap_rooms": [` + strings.Repeat("1,", 100_000) + `1]}`, 400, []string{"rooms: has 100001 entries (at most 100000 per call)"}},
		{"bind without room", "POST", "/register_dp_rank", `{"dp_rank": 0}`, 400, []string{"bootstrap_room: is required"}},
		{"bind unknown instance", "POST", "/instances/10.7.7.7:1/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": 0}`, 404, []string{"not registered"}},
		{"bad alias address", "POST", "/instances/nohost/register_dp_rank", `{"bootstrap_room": 1, "dp_rank": 0}`, 400, []string{"bootstrap_addr"}},
		{"GET register_dp_rank", "GET", "/register_dp_rank", ``, 405, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { b.wantPrefix(t, c.method, c.path, "", c.body, c.code, c.parts...) })
	}
	// Nothing refused was stored: still one rank, the first layout.
	info, found := b.m.PrefillInfo(b.host)
	if !found || info.Registered != 1 || info.PageSize != 16 {
		t.Errorf("after the refused PUTs the instance is %+v (found %v), want the one good rank", info, found)
	}
	if _, found := b.m.PrefillInfo("10.0.0.2:8998"); found {
		t.Error("a mismatched prefill was stored")
	}
}

// TestHTTPBootstrapTimeRules runs the routes, the manager's loops and a
// fake prefill /health server in a synctest bubble over in-memory
// connections: bindings expire after dp_rank.binding_ttl, an HTTP-registered
// instance stays registered while its /health answers and is declared dead
// heartbeat_max_failures × heartbeat_interval after it stops.
func TestHTTPBootstrapTimeRules(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, dec := newManager(t, 1, func(c *kvmanager.Config) {
			c.Timeouts.HeartbeatInterval = 5 * time.Second
			c.Timeouts.HeartbeatMaxFailures = 2
			c.DPRank.BindingTTL = 120 * time.Second
		})
		srv, err := server.New(server.DefaultConfig(), server.Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Layout: dec.Layout(), TransferPath: "sim", Manager: m})
		if err != nil {
			t.Fatal(err)
		}
		var net pipenet.Network
		tr := &http.Transport{DialContext: net.DialContext}
		bh, err := srv.NewBootstrapHTTP(server.BootstrapHTTPOptions{HealthClient: &http.Client{Transport: tr}})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		bh.Register(mux)
		daemon := &http.Server{Handler: mux}
		dl := net.Listen("decodeplane:8998")
		go daemon.Serve(dl)
		var healthy atomic.Bool
		healthy.Store(true)
		var polls atomic.Int64
		prefill := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			polls.Add(1)
			if r.URL.Path != "/health" || !healthy.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "OK")
		})}
		pl := net.Listen("10.0.0.1:30000")
		go prefill.Serve(pl)
		ctx, cancel := context.WithCancel(context.Background())
		loops := make(chan error, 2)
		go func() { loops <- m.Run(ctx) }()
		go func() { loops <- bh.Run(ctx) }()

		client := &http.Client{Transport: &http.Transport{DialContext: net.DialContext, DisableKeepAlives: true}}
		call := func(method, path, body string) (int, string) {
			t.Helper()
			req, _ := http.NewRequest(method, "http://decodeplane:8998"+path, strings.NewReader(body))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", method, path, err)
			}
			defer resp.Body.Close()
			out, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(out)
		}
		if code, body := call("PUT", "/route", putBody(1, 0, 2, 0, "10.0.0.1", 17000, 16, "bf16", "round_robin", 30000)); code != 200 {
			t.Fatalf("PUT /route = %d %q", code, body)
		}
		if code, body := call("PUT", "/route", putBody(1, 0, 2, 1, "10.0.0.1", 17001, 16, "bf16", "round_robin", 30000)); code != 200 {
			t.Fatalf("PUT /route = %d %q", code, body)
		}
		call("POST", "/register_dp_rank", `{"bootstrap_room": 42, "dp_rank": 1}`)
		time.Sleep(119 * time.Second)
		synctest.Wait()
		if code, body := call("POST", "/query_dp_ranks", `{"bootstrap_rooms": [42]}`); code != 200 || body != `{"42": 1}` {
			t.Errorf("query after 119 s = %d %q, want the binding", code, body)
		}
		// Alive the whole time: /health answered.
		if _, ok := m.PrefillInfo("decodeplane:8998"); !ok {
			t.Fatal("the instance died although its /health answered")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if code, body := call("POST", "/query_dp_ranks", `{"bootstrap_rooms": [42]}`); code != 200 || body != `{}` {
			t.Errorf("query after 121 s = %d %q, want the binding expired ({})", code, body)
		}
		if n := polls.Load(); n < 119/5*2-2 {
			t.Errorf("%d /health polls in 121 s, want about two per 5 s interval", n)
		}
		// /health stops answering at 121 s; the last good poll was at 120 s
		// (polls every 2.5 s): dead 2 × 5 s later, found within the
		// manager's quarter-interval check, so in (130 s, 131.25 s].
		healthy.Store(false)
		time.Sleep(7 * time.Second)
		synctest.Wait()
		if _, ok := m.PrefillInfo("decodeplane:8998"); !ok {
			t.Error("the instance died less than max_failures × interval after its last good poll")
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if code, body := call("GET", "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1", ""); code != 503 || body != "Prefill server not fully registered yet (0 workers registered)." {
			t.Errorf("after /health stopped, GET /route = %d %q, want 503 with 0 workers", code, body)
		}
		time.Sleep(5 * time.Second) // a poll round drops the dead instance
		synctest.Wait()
		if got := bh.Polled(); len(got) != 0 {
			t.Errorf("still polling %v after the instance died", got)
		}
		cancel()
		<-loops
		<-loops
		daemon.Close()
		prefill.Close()
		client.CloseIdleConnections()
		tr.CloseIdleConnections()
		m.Shutdown(context.Background())
	})
}

// TestHTTPBootstrapInstanceIDHeader: a new X-SGLang-Disaggregation-Instance-ID
// behind the same address replaces the instance, as instance_id over gRPC.
func TestHTTPBootstrapInstanceIDHeader(t *testing.T) {
	b := newHTTPBoot(t, "")
	put := func(id string, tp, rank int) {
		t.Helper()
		req, _ := http.NewRequest("PUT", b.url+"/route", strings.NewReader(putBody(tp, rank, 1, 0, "10.0.0.1", 17000+rank, 16, "bf16", "", 30000)))
		req.Header.Set(server.InstanceIDHeader, id)
		resp, err := b.client.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("PUT /route as %s: %v %v", id, resp, err)
		}
		resp.Body.Close()
	}
	put("proc-a", 2, 0)
	put("proc-a", 2, 1)
	if info, _ := b.m.PrefillInfo(b.host); info.InstanceID != "proc-a" || !info.Complete {
		t.Fatalf("after proc-a's two ranks: %+v", info)
	}
	// proc-b replaces proc-a with another layout: its first rank starts a new
	// instance (proc-a's ranks are gone), so it is incomplete again.
	put("proc-b", 1, 0)
	if info, _ := b.m.PrefillInfo(b.host); info.InstanceID != "proc-b" || info.Registered != 1 || info.Topology.AttnTP != 1 {
		t.Errorf("after proc-b registered: %+v, want proc-b's one rank", info)
	}
}

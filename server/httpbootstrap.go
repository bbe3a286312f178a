package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// SGLang's bootstrap HTTP routes (CommonKVBootstrapServer), served from the
// same registry and the same Bootstrap handlers as the gRPC API: every
// request is mapped to its proto request, checked with its Validate method,
// and answered by the gRPC service's method; errors map from the gRPC code
// (httpStatusOf). The instance a bare route speaks of is the bootstrap_addr
// the caller dialed, as its Host header carries it ("host:port"; port 80
// when absent); /instances/{host:port}/route, .../register_dp_rank and
// .../query_dp_ranks name it explicitly.

// Bounds of the HTTP surface.
const (
	// MaxHTTPBodyBytes bounds every request body (http.MaxBytesReader).
	MaxHTTPBodyBytes = 1 << 20
	// MaxHTTPPolledInstances bounds the HTTP-registered instances whose
	// /health the daemon polls; a PUT /route for one more is refused (503).
	MaxHTTPPolledInstances = 4096
	// maxPolls is how many /health polls run at once.
	maxPolls = 16
	// maxHTTPStringLen bounds rank_ip, kv_cache_dtype, load_balance_method
	// and the instance id header.
	maxHTTPStringLen = 256
	// InstanceIDHeader carries a prefill process's instance id (SGLang PR
	// #34289's proposal); a new id behind the same address replaces the
	// instance, as instance_id does over gRPC.
	InstanceIDHeader = "X-SGLang-Disaggregation-Instance-ID"
)

// pollTarget is an HTTP-registered instance's liveness probe.
type pollTarget struct {
	url        string
	instanceID string
}

// BootstrapHTTP serves SGLang's bootstrap routes and keeps the instances
// registered through them alive by polling their /health.
type BootstrapHTTP struct {
	s      *Server
	b      *bootstrapService
	m      *kvmanager.Manager
	client *http.Client

	mu     sync.Mutex
	polled map[string]pollTarget // bootstrap_addr → probe
}

// BootstrapHTTPOptions configure NewBootstrapHTTP.
type BootstrapHTTPOptions struct {
	// HealthClient polls the prefills' /health; nil means a client with no
	// keep-alive pool beyond the defaults and the poll timeout. Tests give
	// one that dials an in-memory listener.
	HealthClient *http.Client
}

// NewBootstrapHTTP builds the bootstrap routes over the server's Bootstrap
// service. The server must have a Manager.
func (s *Server) NewBootstrapHTTP(opts BootstrapHTTPOptions) (*BootstrapHTTP, error) {
	if s.deps.Manager == nil {
		return nil, errors.New("the bootstrap HTTP routes need a room manager")
	}
	c := opts.HealthClient
	if c == nil {
		c = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute,
			ResponseHeaderTimeout: 5 * time.Second}}
	}
	return &BootstrapHTTP{s: s, b: &bootstrapService{s: s, m: s.deps.Manager, reg: s.registrar()}, m: s.deps.Manager, client: c,
		polled: map[string]pollTarget{}}, nil
}

// Register adds the routes to mux: the bare SGLang routes and their
// /instances/{addr}/ aliases.
func (h *BootstrapHTTP) Register(mux *http.ServeMux) {
	for _, prefix := range []string{"", "/instances/{addr}"} {
		mux.HandleFunc(prefix+"/route", h.guard(h.route))
		mux.HandleFunc("POST "+prefix+"/register_dp_rank", h.guard(h.registerDPRank))
		mux.HandleFunc("POST "+prefix+"/query_dp_ranks", h.guard(h.queryDPRanks))
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "OK") })
}

// guard recovers a panic into a 500 with a generic body (the stack is
// logged) and bounds the body.
func (h *BootstrapHTTP) guard(f func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				h.s.log.ErrorContext(r.Context(), "panic in HTTP handler", "path", r.URL.Path, "panic", p, "stack", string(debug.Stack()))
				writeText(w, http.StatusInternalServerError, "internal error (logged by the daemon)")
			}
		}()
		r.Body = http.MaxBytesReader(w, r.Body, MaxHTTPBodyBytes)
		f(w, r)
	}
}

// instanceAddr is the bootstrap_addr a request speaks of: the {addr} path
// segment of the alias routes, else the Host header.
func instanceAddr(r *http.Request) string {
	if a := r.PathValue("addr"); a != "" {
		return a
	}
	if _, _, err := net.SplitHostPort(r.Host); err == nil {
		return r.Host
	}
	host := strings.TrimSuffix(strings.TrimPrefix(r.Host, "["), "]")
	return net.JoinHostPort(host, "80")
}

func (h *BootstrapHTTP) authorized(r *http.Request) bool {
	return h.s.cfg.AuthToken == "" || validBearer(r.Header.Values("Authorization"), h.s.cfg.AuthToken)
}

func (h *BootstrapHTTP) route(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut:
		h.putRoute(w, r)
	case http.MethodGet:
		h.getRoute(w, r)
	default:
		writeText(w, http.StatusMethodNotAllowed, "Method not allowed")
	}
}

// putRouteBody is SGLang's PUT /route JSON (CommonKVManager's registration).
type putRouteBody struct {
	AttnTPSize   int64  `json:"attn_tp_size"`
	AttnTPRank   int64  `json:"attn_tp_rank"`
	AttnCPSize   int64  `json:"attn_cp_size"`
	AttnCPRank   int64  `json:"attn_cp_rank"`
	AttnDPSize   int64  `json:"attn_dp_size"`
	AttnDPRank   int64  `json:"attn_dp_rank"`
	PPSize       int64  `json:"pp_size"`
	PPRank       int64  `json:"pp_rank"`
	SystemDPSize int64  `json:"system_dp_size"`
	SystemDPRank int64  `json:"system_dp_rank"`
	RankIP       string `json:"rank_ip"`
	RankPort     int64  `json:"rank_port"`
	PageSize     int64  `json:"page_size"`
	KVCacheDType string `json:"kv_cache_dtype"`
	LoadBalance  string `json:"load_balance_method"`
	DSASplit     bool   `json:"enable_dsa_cache_layer_split"`
	HTTPPort     int64  `json:"prefill_http_port"`
}

// toProto maps the body to RegisterPrefillRequest, checking what only the
// HTTP form has (integer ranges, rank_ip/rank_port, prefill_http_port).
func (b *putRouteBody) toProto(addr, instanceID string) (*pb.RegisterPrefillRequest, error) {
	var errs []error
	u32 := func(field string, v int64) uint32 {
		if v < 0 || v > math.MaxUint32 {
			errs = append(errs, fmt.Errorf("%s: %d is out of range (allowed 0..%d)", field, v, uint32(math.MaxUint32)))
			return 0
		}
		return uint32(v)
	}
	str := func(field, v string) {
		if len(v) > maxHTTPStringLen || !utf8.ValidString(v) {
			errs = append(errs, fmt.Errorf("%s: must be valid UTF-8 of at most %d bytes", field, maxHTTPStringLen))
		}
	}
	req := &pb.RegisterPrefillRequest{
		BootstrapAddr: addr,
		Parallel: &pb.ParallelInfo{
			AttnTpSize: u32("attn_tp_size", b.AttnTPSize), AttnTpRank: u32("attn_tp_rank", b.AttnTPRank),
			AttnCpSize: u32("attn_cp_size", b.AttnCPSize), AttnCpRank: u32("attn_cp_rank", b.AttnCPRank),
			AttnDpSize: u32("attn_dp_size", b.AttnDPSize), AttnDpRank: u32("attn_dp_rank", b.AttnDPRank),
			PpSize: u32("pp_size", b.PPSize), PpRank: u32("pp_rank", b.PPRank),
			SystemDpSize: u32("system_dp_size", b.SystemDPSize), SystemDpRank: u32("system_dp_rank", b.SystemDPRank),
		},
		PageSize:                 u32("page_size", b.PageSize),
		KvCacheDtype:             b.KVCacheDType,
		LoadBalanceMethod:        b.LoadBalance,
		EnableDsaCacheLayerSplit: b.DSASplit,
		InstanceId:               instanceID,
	}
	str("rank_ip", b.RankIP)
	str("kv_cache_dtype", b.KVCacheDType)
	str("load_balance_method", b.LoadBalance)
	str(InstanceIDHeader, instanceID)
	if b.RankIP == "" {
		errs = append(errs, errors.New("rank_ip: is required (this rank's IP)"))
	}
	if b.RankPort <= 0 || b.RankPort > 65535 {
		errs = append(errs, fmt.Errorf("rank_port: %d is not a port (allowed 1..65535)", b.RankPort))
	}
	if b.HTTPPort <= 0 || b.HTTPPort > 65535 {
		errs = append(errs, fmt.Errorf("prefill_http_port: %d is not a port (allowed 1..65535): decodeplane polls http://rank_ip:prefill_http_port/health to keep an HTTP-registered prefill alive", b.HTTPPort))
	}
	req.RankEndpoint = net.JoinHostPort(b.RankIP, strconv.FormatInt(b.RankPort, 10))
	req.PrefillHttpPort = uint32(max(0, min(b.HTTPPort, 65535)))
	if err := req.Validate(); err != nil {
		errs = append(errs, err)
	}
	return req, errors.Join(errs...)
}

func (h *BootstrapHTTP) putRoute(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		writeText(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	var body putRouteBody
	if err := decodeJSON(r.Body, &body); err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}
	addr := instanceAddr(r)
	id := r.Header.Get(InstanceIDHeader)
	req, err := body.toProto(addr, id)
	if err != nil {
		writeText(w, http.StatusBadRequest, badRequest(err))
		return
	}
	target := pollTarget{url: "http://" + net.JoinHostPort(body.RankIP, strconv.FormatInt(body.HTTPPort, 10)) + "/health", instanceID: id}
	h.mu.Lock()
	_, known := h.polled[addr]
	full := !known && len(h.polled) >= MaxHTTPPolledInstances
	h.mu.Unlock()
	if full {
		writeText(w, http.StatusServiceUnavailable, fmt.Sprintf("this daemon already polls %d HTTP-registered prefill instances (the maximum)", MaxHTTPPolledInstances))
		return
	}
	res, err := h.b.RegisterPrefill(r.Context(), req)
	if err != nil {
		writeStatus(w, err)
		return
	}
	h.mu.Lock()
	// The first registration of an instance sets its probe (SGLang's
	// first-PUT-wins prefill_http_port); a replacement resets it.
	if old, ok := h.polled[addr]; !ok || res.GetReplaced() || old.instanceID != id && id != "" {
		h.polled[addr] = target
	}
	h.mu.Unlock()
	writeText(w, http.StatusOK, "OK")
}

func (h *BootstrapHTTP) getRoute(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	names := [4]string{"prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank"}
	var v [4]int64
	for i, n := range names {
		if !q.Has(n) {
			writeText(w, http.StatusBadRequest, "Missing inputs for bootstrap server.")
			return
		}
		x, err := strconv.ParseInt(q.Get(n), 10, 64)
		if err != nil {
			// SGLang answers 500 here (int() raises); a bad parameter is the caller's error.
			writeText(w, http.StatusBadRequest, fmt.Sprintf("Bad request: %s=%q is not an integer", n, q.Get(n)))
			return
		}
		v[i] = x
	}
	addr := instanceAddr(r)
	if v == [4]int64{-1, -1, -1, -1} {
		info, ok := h.m.PrefillInfo(addr)
		if !ok || !info.Complete {
			writeText(w, http.StatusServiceUnavailable, fmt.Sprintf("Prefill server not fully registered yet (%d workers registered).", info.Registered))
			return
		}
		t := info.Topology
		var o pyObject
		o.int("attn_tp_size", int64(t.AttnTP))
		o.int("attn_cp_size", int64(t.AttnCP))
		o.int("dp_size", int64(t.DP))
		o.int("pp_size", int64(t.PP))
		o.int("page_size", int64(info.PageSize))
		o.str("kv_cache_dtype", info.KVDType)
		o.bool("follow_bootstrap_room", t.FollowBootstrapRoom)
		o.bool("enable_dsa_cache_layer_split", t.DSACacheLayerSplit)
		o.int("prefill_http_port", int64(info.HTTPPort))
		writeJSON(w, o.close())
		return
	}
	notFound := func() string {
		return fmt.Sprintf("Bootstrap info not found for dp_rank=%d cp_rank=%d tp_rank=%d pp_rank=%d", v[0], v[1], v[2], v[3])
	}
	for _, x := range v {
		if x < 0 || x > math.MaxInt32 {
			writeText(w, http.StatusNotFound, notFound())
			return
		}
	}
	ep, complete, ok := h.m.RankEndpoint(kvmanager.RankID{Addr: addr, DP: int(v[0]), CP: int(v[1]), TP: int(v[2]), PP: int(v[3])})
	if !complete {
		info, _ := h.m.PrefillInfo(addr)
		writeText(w, http.StatusServiceUnavailable, fmt.Sprintf("Prefill server not fully registered yet (%d workers registered).", info.Registered))
		return
	}
	if !ok {
		writeText(w, http.StatusNotFound, notFound())
		return
	}
	host, port, err := net.SplitHostPort(ep)
	p, perr := strconv.Atoi(port)
	if err != nil || perr != nil {
		writeText(w, http.StatusNotFound, notFound()+fmt.Sprintf(" (the rank registered over gRPC with endpoint %q, which is not rank_ip:rank_port)", ep))
		return
	}
	var o pyObject
	o.str("rank_ip", host)
	o.int("rank_port", int64(p))
	writeJSON(w, o.close())
}

func (h *BootstrapHTTP) registerDPRank(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		writeText(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	var body struct {
		Room *uint64 `json:"bootstrap_room"`
		DP   *int64  `json:"dp_rank"`
	}
	qb := getQueryBufs()
	defer putQueryBufs(qb)
	raw, err := readBody(r.Body, qb.b[:0])
	qb.b = raw
	if err != nil {
		writeText(w, http.StatusBadRequest, decodeJSON(io.MultiReader(bytes.NewReader(raw), errReader{err}), &body).Error())
		return
	}
	if v, seen, ok := scanUintObject(raw, [2]string{"bootstrap_room", "dp_rank"}); ok && v[1] <= math.MaxInt64 {
		if seen[0] {
			body.Room = &v[0]
		}
		if seen[1] {
			dp := int64(v[1])
			body.DP = &dp
		}
	} else if err := decodeJSON(bytes.NewReader(raw), &body); err != nil {
		writeText(w, http.StatusBadRequest, err.Error())
		return
	}
	var errs []error
	if body.Room == nil {
		errs = append(errs, errors.New("bootstrap_room: is required (an integer in [0, 2^63-1])"))
	}
	if body.DP == nil {
		errs = append(errs, errors.New("dp_rank: is required (the prefill DP rank that scheduled the room)"))
	} else if *body.DP < 0 || *body.DP > math.MaxUint32 {
		errs = append(errs, fmt.Errorf("dp_rank: %d is out of range (allowed 0..dp_size-1)", *body.DP))
	}
	if len(errs) > 0 {
		writeText(w, http.StatusBadRequest, badRequest(errors.Join(errs...)))
		return
	}
	req := &pb.BindRoomRequest{BootstrapAddr: instanceAddr(r), Room: *body.Room, DpRank: uint32(*body.DP)}
	if err := req.Validate(); err != nil {
		writeText(w, http.StatusBadRequest, badRequest(err))
		return
	}
	// The domain call of Bootstrap.BindRoom, without the proto answer.
	if _, err := h.m.BindRoom(req.GetBootstrapAddr(), req.GetRoom(), int(req.GetDpRank())); err != nil {
		writeStatus(w, toStatus(r.Context(), h.s.log, err))
		return
	}
	writeText(w, http.StatusOK, "OK")
}

func (h *BootstrapHTTP) queryDPRanks(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Rooms []uint64 `json:"bootstrap_rooms"`
	}
	qb := getQueryBufs()
	defer putQueryBufs(qb)
	raw, err := readBody(r.Body, qb.b[:0])
	qb.b = raw
	if err != nil {
		writeText(w, http.StatusBadRequest, decodeJSON(io.MultiReader(bytes.NewReader(raw), errReader{err}), &body).Error())
		return
	}
	rooms, ok := scanRoomListInto(raw, qb.rooms[:0])
	if ok {
		qb.rooms = rooms
	} else {
		if err := decodeJSON(bytes.NewReader(raw), &body); err != nil {
			writeText(w, http.StatusBadRequest, err.Error())
			return
		}
		rooms = body.Rooms
	}
	addr := instanceAddr(r)
	// The wire bounds of Bootstrap.LookupDPRanks, checked in their one place.
	if err := (&pb.LookupDPRanksRequest{BootstrapAddr: addr, Rooms: rooms}).Validate(); err != nil {
		writeText(w, http.StatusBadRequest, badRequest(err))
		return
	}
	// The domain call of Bootstrap.LookupDPRanks (no hints here), answered
	// without the proto round trip: this is the hot read.
	var o pyObject
	res, _, err := h.m.LookupDPRanks(addr, rooms, nil)
	if errors.Is(err, kvmanager.ErrPrefillNotFound) {
		writeJSON(w, o.close()) // SGLang: an empty table answers {}
		return
	}
	if err != nil {
		writeStatus(w, toStatus(r.Context(), h.s.log, err))
		return
	}
	// The answer is written into the request's buffer (the body is parsed
	// by now) and handed to w, which copies it before Write returns.
	// A local slice (no pyObject field writes in the loop) keeps the
	// per-room appends free of GC write barriers.
	out := append(qb.b[:0], '{')
	for i, x := range res {
		if i > 0 {
			out = append(out, ", "...)
		}
		out = append(out, '"')
		out = strconv.AppendUint(out, x.Room, 10)
		out = append(out, `": `...)
		out = strconv.AppendInt(out, int64(x.DP), 10)
	}
	out = append(out, '}')
	qb.b = out
	writeJSON(w, out)
}

// queryBufs are one /query_dp_ranks call's request/answer bytes and parsed
// rooms, reused through queryPool.
type queryBufs struct {
	b     []byte
	rooms []uint64
}

var queryPool = sync.Pool{New: func() any { return &queryBufs{b: make([]byte, 0, 2048), rooms: make([]uint64, 0, 64)} }}

func getQueryBufs() *queryBufs { return queryPool.Get().(*queryBufs) }

// putQueryBufs returns the buffers to the pool unless they grew past 64 KiB
// (a rare large call does not pin its memory).
func putQueryBufs(q *queryBufs) {
	if cap(q.b) <= 64<<10 && cap(q.rooms) <= 8<<10 {
		queryPool.Put(q)
	}
}

// readBody is io.ReadAll into b (reused from the pool).
func readBody(r io.Reader, b []byte) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err != nil {
			if err == io.EOF {
				err = nil
			}
			return b, err
		}
	}
}

// Run polls every HTTP-registered instance's http://rank_ip:prefill_http_port/health
// twice per heartbeat interval (at most maxPolls at once, each bounded by
// the interval); a 200 counts as a heartbeat of all its ranks. An instance
// with no successful poll for heartbeat_max_failures × heartbeat_interval is
// declared dead by the manager, as a gRPC prefill that stops heartbeating.
// It returns ctx's error.
func (h *BootstrapHTTP) Run(ctx context.Context) error {
	iv, _ := h.m.HeartbeatPolicy()
	t := time.NewTicker(iv / 2)
	defer t.Stop()
	defer h.client.CloseIdleConnections()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			h.pollOnce(ctx, iv)
		}
	}
}

func (h *BootstrapHTTP) pollOnce(ctx context.Context, timeout time.Duration) {
	h.mu.Lock()
	targets := make(map[string]pollTarget, len(h.polled))
	for a, t := range h.polled {
		targets[a] = t
	}
	h.mu.Unlock()
	sem := make(chan struct{}, maxPolls)
	var wg sync.WaitGroup
	for addr, tg := range targets {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if !h.healthy(ctx, tg.url, timeout) {
				return
			}
			if !h.b.reg.Touch(ctx, addr, tg.instanceID) {
				h.mu.Lock()
				if h.polled[addr] == tg {
					delete(h.polled, addr) // dead or replaced: registers again to be polled again
				}
				h.mu.Unlock()
			}
		})
	}
	wg.Wait()
	// Instances that died (no longer registered) are dropped too.
	for addr, tg := range targets {
		if _, ok := h.m.PrefillInfo(addr); !ok {
			h.mu.Lock()
			if h.polled[addr] == tg {
				delete(h.polled, addr)
			}
			h.mu.Unlock()
		}
	}
}

func (h *BootstrapHTTP) healthy(ctx context.Context, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Polled returns the bootstrap addresses whose /health is polled (tests,
// status).
func (h *BootstrapHTTP) Polled() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.polled))
	for a := range h.polled {
		out = append(out, a)
	}
	return out
}

// errReader returns err (a body read error, e.g. http.MaxBytesError, for
// decodeJSON to name).
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// scanUintObject is the fast path of /register_dp_rank: a flat JSON object
// whose keys are among names (each at most once) and whose values are
// decimal integers that fit in uint64; anything else reports !ok and
// encoding/json decides.
func scanUintObject(b []byte, names [2]string) (vals [2]uint64, seen [2]bool, ok bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	ws()
	if i >= len(b) || b[i] != '{' {
		return vals, seen, false
	}
	i++
	ws()
	if i < len(b) && b[i] == '}' {
		i++
		ws()
		return vals, seen, i == len(b)
	}
	for {
		ws()
		k := -1
		for j, n := range names {
			if len(b)-i >= len(n)+2 && b[i] == '"' && string(b[i+1:i+1+len(n)]) == n && b[i+1+len(n)] == '"' {
				k = j
				i += len(n) + 2
				break
			}
		}
		if k < 0 || seen[k] {
			return vals, seen, false
		}
		ws()
		if i >= len(b) || b[i] != ':' {
			return vals, seen, false
		}
		i++
		ws()
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			d := uint64(b[i] - '0')
			if v > (math.MaxUint64-d)/10 {
				return vals, seen, false
			}
			v = v*10 + d
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return vals, seen, false
		}
		vals[k], seen[k] = v, true
		ws()
		if i < len(b) && b[i] == ',' {
			i++
			continue
		}
		if i < len(b) && b[i] == '}' {
			i++
			ws()
			return vals, seen, i == len(b)
		}
		return vals, seen, false
	}
}

// scanRoomList is the fast path of /query_dp_ranks: it parses exactly
// {"bootstrap_rooms": [n, ...]} with decimal integers that fit in uint64 and
// optional whitespace; anything else (another key, a sign, a fraction, an
// overflow) reports !ok and encoding/json decides.
func scanRoomList(b []byte) ([]uint64, bool) { return scanRoomListInto(b, make([]uint64, 0, 64)) }

// scanRoomListInto is scanRoomList appending to rooms.
func scanRoomListInto(b []byte, rooms []uint64) ([]uint64, bool) {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
			i++
		}
	}
	lit := func(s string) bool {
		ws()
		if !bytes.HasPrefix(b[i:], []byte(s)) {
			return false
		}
		i += len(s)
		return true
	}
	if !lit("{") || !lit(`"bootstrap_rooms"`) || !lit(":") || !lit("[") {
		return nil, false
	}
	ws()
	if i < len(b) && b[i] == ']' {
		i++
	} else {
		for {
			ws()
			start := i
			var v uint64
			for i < len(b) && b[i] >= '0' && b[i] <= '9' {
				d := uint64(b[i] - '0')
				if v > (math.MaxUint64-d)/10 {
					return nil, false
				}
				v = v*10 + d
				i++
			}
			if i == start || (b[start] == '0' && i-start > 1) {
				return nil, false
			}
			rooms = append(rooms, v)
			ws()
			if i < len(b) && b[i] == ',' {
				i++
				continue
			}
			if i < len(b) && b[i] == ']' {
				i++
				break
			}
			return nil, false
		}
	}
	if !lit("}") {
		return nil, false
	}
	ws()
	return rooms, i == len(b)
}

// decodeJSON decodes one JSON value; errors name the field and the type.
func decodeJSON(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		var mb *http.MaxBytesError
		switch {
		case errors.As(err, &mb):
			return fmt.Errorf("Bad request: the body is larger than %d bytes", mb.Limit)
		case errors.As(err, &te):
			return fmt.Errorf("Bad request: %s: a JSON %s is not allowed (want %s)", te.Field, te.Value, jsonKind(te.Type.Kind().String()))
		case errors.Is(err, io.EOF):
			return errors.New("Bad request: the body is empty (want a JSON object)")
		}
		return fmt.Errorf("Bad request: the body is not JSON: %v", err)
	}
	return nil
}

func jsonKind(k string) string {
	switch {
	case strings.HasPrefix(k, "int"), strings.HasPrefix(k, "uint"):
		return "an integer in range (non-negative where unsigned)"
	case k == "slice":
		return "a list"
	}
	return "a " + k
}

func badRequest(err error) string {
	return "Bad request: " + strings.ReplaceAll(strings.ReplaceAll(err.Error(), "\n", "; "), "parallel.", "")
}

// httpStatusOf maps a gRPC code to the HTTP status of the bootstrap routes.
func httpStatusOf(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted, codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499
	}
	return http.StatusInternalServerError
}

func writeStatus(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	writeText(w, httpStatusOf(st.Code()), st.Message())
}

// writeText answers a text body as aiohttp's web.Response(text=...).
func writeText(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// writeJSON answers a JSON body as aiohttp's web.json_response.
func writeJSON(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// pyObject writes a flat JSON object the way Python's json.dumps does by
// default (", " and ": " separators, ensure_ascii), so that a byte-exact
// comparison with SGLang's server sees the same bytes.
type pyObject struct{ b []byte }

func (o *pyObject) key(k string) {
	if len(o.b) == 0 {
		o.b = append(o.b, '{')
	} else {
		o.b = append(o.b, ", "...)
	}
	o.b = pyQuote(o.b, k)
	o.b = append(o.b, ": "...)
}

func (o *pyObject) int(k string, v int64) { o.key(k); o.b = strconv.AppendInt(o.b, v, 10) }

func (o *pyObject) str(k, v string)       { o.key(k); o.b = pyQuote(o.b, v) }
func (o *pyObject) bool(k string, v bool) { o.key(k); o.b = strconv.AppendBool(o.b, v) }

func (o *pyObject) close() []byte {
	if len(o.b) == 0 {
		return []byte("{}")
	}
	return append(o.b, '}')
}

// pyQuote appends s as json.dumps(ensure_ascii=True) quotes it.
func pyQuote(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"':
			b = append(b, '\\', '"')
		case r == '\\':
			b = append(b, '\\', '\\')
		case r == '\n':
			b = append(b, '\\', 'n')
		case r == '\r':
			b = append(b, '\\', 'r')
		case r == '\t':
			b = append(b, '\\', 't')
		case r == '\b':
			b = append(b, '\\', 'b')
		case r == '\f':
			b = append(b, '\\', 'f')
		case r < 0x20 || r >= 0x80:
			if r > 0xffff {
				r -= 0x10000
				hi, lo := 0xd800+(r>>10), 0xdc00+(r&0x3ff)
				b = append(b, '\\', 'u', hex[hi>>12], hex[hi>>8&15], hex[hi>>4&15], hex[hi&15])
				r = lo
			}
			b = append(b, '\\', 'u', hex[r>>12], hex[r>>8&15], hex[r>>4&15], hex[r&15])
		default:
			b = append(b, byte(r))
		}
	}
	return append(b, '"')
}

// Package httpboot serves SGLang's bootstrap HTTP routes
// (CommonKVBootstrapServer) from the same registry as the gRPC API: every
// request is mapped to its proto request, checked with its Validate
// method, and answered by the operation table's Bootstrap ops (package
// ops); errors map from the gRPC code (httpStatusOf). The instance a bare
// route speaks of is the bootstrap_addr the caller dialed, as its Host
// header carries it ("host:port"; port 80 when absent);
// /instances/{host:port}/route, .../register_dp_rank and
// .../query_dp_ranks name it explicitly. The instances registered here are
// kept alive by polling their /health (poll.go).
package httpboot

import (
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/server/internal/ops"
)

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

// Routes serves SGLang's bootstrap routes and keeps the instances
// registered through them alive by polling their /health.
type Routes struct {
	t      *ops.Table
	m      Prefills
	token  string
	client *http.Client

	mu     sync.Mutex
	polled map[string]pollTarget // bootstrap_addr → probe
}

// Prefills is what the routes read of the room manager besides the
// table's ops: the registry's view of an instance and its ranks, the
// heartbeat policy, and the bindings /query_dp_ranks answers from, the hot
// read, answered in SGLang's JSON without a proto round trip.
type Prefills interface {
	PrefillInfo(addr string) (info kvmanager.PrefillServerInfo, ok bool)
	RankEndpoint(rank kvmanager.RankID) (endpoint string, complete, ok bool)
	HeartbeatPolicy() (time.Duration, int)
	BoundDPRanks(addr string, rooms []uint64, out []kvmanager.DPResolution) []kvmanager.DPResolution
}

// Options configure New.
type Options struct {
	// HealthClient polls the prefills' /health; nil means a client with no
	// keep-alive pool beyond the defaults and the poll timeout. Tests give
	// one that dials an in-memory listener.
	HealthClient *http.Client
}

// New builds the bootstrap routes over the table's Bootstrap ops (which
// need its room manager, m) and the bootstrap token ("" needs none).
func New(t *ops.Table, m Prefills, token string, opts Options) *Routes {
	c := opts.HealthClient
	if c == nil {
		c = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute,
			ResponseHeaderTimeout: 5 * time.Second}}
	}
	return &Routes{t: t, m: m, token: token, client: c, polled: map[string]pollTarget{}}
}

// Register adds the routes to mux: the bare SGLang routes and their
// /instances/{addr}/ aliases.
func (h *Routes) Register(mux *http.ServeMux) {
	for _, prefix := range []string{"", "/instances/{addr}"} {
		mux.HandleFunc(prefix+"/route", h.guard(h.route))
		mux.HandleFunc("POST "+prefix+"/register_dp_rank", h.guard(h.registerDPRank))
		mux.HandleFunc("POST "+prefix+"/query_dp_ranks", h.guard(h.queryDPRanks))
	}
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { writeText(w, http.StatusOK, "OK") })
}

// guard recovers a panic into a 500 with a generic body (the stack is
// logged) and bounds the body.
func (h *Routes) guard(f func(http.ResponseWriter, *http.Request)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				h.t.Panicked(r.Context(), "panic in HTTP handler", []slog.Attr{slog.String("path", r.URL.Path)}, p)
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

func (h *Routes) authorized(r *http.Request) bool {
	return h.token == "" || ops.ValidBearer(r.Header.Values("Authorization"), h.token)
}

func (h *Routes) route(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodPut:
		h.putRoute(w, r)
	case http.MethodGet:
		h.getRoute(w, r)
	default:
		writeText(w, http.StatusMethodNotAllowed, "Method not allowed")
	}
}

package httpboot

// PUT /route (a prefill rank registers) and GET /route (the instance, or a
// rank's endpoint).

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"unicode/utf8"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

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

func (h *Routes) putRoute(w http.ResponseWriter, r *http.Request) {
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
	res, err := h.t.RegisterPrefill.Call(r.Context(), req)
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

func (h *Routes) getRoute(w http.ResponseWriter, r *http.Request) {
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

// Package metrics is decodeplane's Prometheus instrumentation: the room
// manager's events (Metrics implements kvmanager.Observer), gauges read from
// the ledgers and staging rings at scrape time, and the gRPC server metrics
// (go-grpc-middleware's names and counting, with each method's series cached:
// grpc.go). The composition root (internal/daemon) builds one, hands it to
// the manager as its Observer and to the server as its call metrics
// (GRPCMethod behind server.CallMetrics), and serves Handler on
// server.metrics_listen. Every child series the room path updates is looked
// up once, not by label values per event; the per-bootstrap_addr series are
// deleted once their instance is gone.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/prealloc"
)

// Metrics is decodeplane's Prometheus instrumentation: the manager's events
// (it implements kvmanager.Observer), gauges read from the ledgers at scrape
// time, and the gRPC server metrics. Names follow Prometheus
// conventions: decodeplane_ prefix, base units in the name.
type Metrics struct {
	reg    *prometheus.Registry
	grpc   *grpcMetrics
	resync resyncMetrics // resync.go
	engine engineMetrics // engine.go
	// session: the decode engine's EngineSession ops (session.go).
	session sessionMetrics
	// registry: the fleet registry (registry.go).
	registry registryMetrics
	// sglang: the sglang:* metrics (sglang.go); nil unless EnableSGLang.
	sglang *sglangMetrics

	rooms             *prometheus.GaugeVec
	finished          *prometheus.CounterVec
	handoff           *prometheus.HistogramVec
	openToDest        prometheus.Histogram
	destToSuccess     prometheus.Histogram
	transferSpeed     prometheus.Histogram
	failedByPhase     *prometheus.CounterVec
	chunks            *prometheus.CounterVec
	chunkDuration     *prometheus.HistogramVec
	transferBytes     prometheus.Counter
	dpResolutions     *prometheus.CounterVec
	dpByRule          [8]prometheus.Counter // dpResolutions' children, set by Attach (a lookup counts each room)
	admissionPasses   *prometheus.CounterVec
	admissionBlocked  *prometheus.CounterVec
	registrations     *prometheus.CounterVec
	heartbeatMisses   *prometheus.CounterVec
	prefillLost       *prometheus.CounterVec
	staleIncarnation  *prometheus.CounterVec
	drain             drainMetrics       // deferred release (drain.go)
	reuseViolations   prometheus.Counter // the reuse invariant (reuse.go)
	prefillSessionOps *prefillSessionOps // prefill sessions' ops (prefill_session.go)

	// The children the room path updates, each looked up by label values
	// once, on first use (a series appears when it did before: at Attach or
	// at its first event), instead of on every event.
	roomsByPhase  [kvmanager.PhaseHeld + 1]func() prometheus.Gauge
	failedIn      [kvmanager.PhaseHeld + 1]func() prometheus.Counter
	succeeded     func() prometheus.Counter
	failedBy      [kvmanager.FailureDeadlineExceeded + 1]func() prometheus.Counter
	handoffOK     func() prometheus.Observer
	handoffFailed func() prometheus.Observer
	chunksOK      func() prometheus.Counter
	chunksFailed  func() prometheus.Counter
	chunkOK       func() prometheus.Observer
	chunkFailed   func() prometheus.Observer
	// admitted is admissionPasses' child per shard, set by Attach before the
	// manager runs and only read afterwards.
	admitted []prometheus.Counter

	mu      sync.Mutex
	manager *kvmanager.Manager

	// addrMu guards addrSeries: the bootstrap addresses that have
	// per-address series (heartbeatMisses, prefillLost), each with the
	// sequence number of its last event. A scrape deletes the series of an
	// address the manager no longer knows and no room refers to
	// (pruneAddrSeries), so that they stay bounded by the instances alive
	// or still referred to.
	addrMu     sync.Mutex
	addrSeries map[string]uint64
	addrSeq    uint64
}

var _ kvmanager.Observer = (*Metrics)(nil)

// latencyBuckets spans 100µs to ~100s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0001, 2.5, 16)

// New builds the registry with process and Go runtime collectors.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg:             reg,
		grpc:            newGRPCMetrics(),
		resync:          newResyncMetrics(),
		engine:          newEngineMetrics(),
		reuseViolations: newReuseViolations(),
		registry:        newRegistryMetrics(),
		rooms: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "decodeplane_rooms", Help: "Rooms held by the daemon, by phase (finished rooms stay until their retention ends).",
		}, []string{"phase"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_rooms_finished_total", Help: "Rooms whose KV hand-off ended, by outcome and failure reason.",
		}, []string{"outcome", "reason"}),
		handoff: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "decodeplane_room_handoff_duration_seconds", Help: "Time from OpenRoom to success or failure.", Buckets: latencyBuckets,
		}, []string{"outcome"}),
		openToDest: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "decodeplane_room_open_to_destination_seconds", Help: "Time from OpenRoom to admission (destination ready for prefill).", Buckets: latencyBuckets,
		}),
		destToSuccess: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "decodeplane_room_destination_to_success_seconds", Help: "Time from admission to KV landed (success).", Buckets: latencyBuckets,
		}),
		transferSpeed: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "decodeplane_room_transfer_speed_bytes_per_second", Help: "A succeeded room's KV bytes over its time from admission to success (rooms whose chunks reported bytes).",
			Buckets: prometheus.ExponentialBuckets(1e7, 4, 12), // 10 MB/s to ~42 TB/s
		}),
		failedByPhase: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_rooms_failed_by_phase_total", Help: "Rooms that failed, by the phase they were in when they failed.",
		}, []string{"phase"}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_chunks_total", Help: "KV chunks moved or reported, by outcome.",
		}, []string{"outcome"}),
		chunkDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "decodeplane_chunk_duration_seconds", Help: "Time the transfer engine took for one chunk.", Buckets: latencyBuckets,
		}, []string{"outcome"}),
		transferBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "decodeplane_transfer_bytes_total", Help: "KV bytes landed in decode pages.",
		}),
		dpResolutions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_dp_rank_resolutions_total", Help: "Prefill DP-rank resolutions, by the rule that resolved them.",
		}, []string{"rule"}),
		admissionPasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_admission_admitted_total", Help: "Rooms admitted (KV pre-allocated), by decode DP shard.",
		}, []string{"dp_rank"}),
		admissionBlocked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_admission_blocked_total", Help: "Admission passes that stopped with rooms still queued, by shard and reason.",
		}, []string{"dp_rank", "reason"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_prefill_registrations_total", Help: "Prefill rank registrations, by whether they replaced an earlier one.",
		}, []string{"replaced"}),
		heartbeatMisses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_prefill_heartbeat_failures_total", Help: "Liveness checks that found a prefill rank's heartbeat overdue.",
		}, []string{"bootstrap_addr"}),
		prefillLost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_prefill_lost_total", Help: "Prefill instances declared dead after missed heartbeats.",
		}, []string{"bootstrap_addr"}),
		staleIncarnation: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "decodeplane_stale_incarnation_total",
			Help: "Calls refused (FAILED_PRECONDITION STALE_INCARNATION) because they named a destination of an earlier daemon incarnation, by method.",
		}, []string{"method"}),
	}
	reg.MustRegister(
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.rooms, m.finished, m.handoff, m.openToDest, m.destToSuccess, m.transferSpeed, m.failedByPhase, m.chunks, m.chunkDuration,
		m.transferBytes, m.dpResolutions, m.admissionPasses, m.admissionBlocked, m.registrations,
		m.heartbeatMisses, m.prefillLost, m.staleIncarnation, ledgerCollector{m}, capacityCollector{m}, holdsCollector{m}, m.reuseViolations,
	)
	reg.MustRegister(m.grpc.collectors()...)
	reg.MustRegister(m.resync.collectors()...)
	reg.MustRegister(m.engine.collectors()...)
	m.session = newSessionMetrics()
	reg.MustRegister(m.session.ops)
	reg.MustRegister(m.registry.collectors()...)
	m.drain = newDrainMetrics()
	m.drain.register(reg, m)
	m.prefillSessionOps = newPrefillSessionOps()
	reg.MustRegister(m.prefillSessionOps.vec)
	for p := range m.roomsByPhase {
		m.roomsByPhase[p] = child(m.rooms.MetricVec, kvmanager.Phase(p).String()).gauge
		m.failedIn[p] = child(m.failedByPhase.MetricVec, kvmanager.Phase(p).String()).counter
	}
	m.succeeded = child(m.finished.MetricVec, "succeeded", "none").counter
	for c := range m.failedBy {
		m.failedBy[c] = child(m.finished.MetricVec, "failed", kvmanager.FailureCode(c).String()).counter
	}
	m.handoffOK, m.handoffFailed = child(m.handoff.MetricVec, "succeeded").observer, child(m.handoff.MetricVec, "failed").observer
	m.chunksOK, m.chunksFailed = child(m.chunks.MetricVec, "ok").counter, child(m.chunks.MetricVec, "failed").counter
	m.chunkOK, m.chunkFailed = child(m.chunkDuration.MetricVec, "ok").observer, child(m.chunkDuration.MetricVec, "failed").observer
	for _, method := range staleMethods {
		m.staleIncarnation.WithLabelValues(method) // at zero from the start
	}
	return m
}

// staleMethods are the methods whose requests name a destination's
// incarnation (decodeplane.v1's Rooms and Staging).
var staleMethods = []string{"AwaitDestination", "Transfer", "ReportTransfer", "AllocateStaging", "ChunkReady"}

// StaleIncarnation counts a call the server refused because it named an
// earlier daemon incarnation (server.StaleMetrics); the method label is the
// method's name ("Transfer").
func (m *Metrics) StaleIncarnation(fullMethod string) {
	name := fullMethod
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		name = fullMethod[i+1:]
	}
	m.staleIncarnation.WithLabelValues(name).Inc()
}

// lazyChild is one series of a vector, made on first use and then kept.
type lazyChild struct {
	get func() prometheus.Metric
}

func child(v *prometheus.MetricVec, labels ...string) lazyChild {
	return lazyChild{get: sync.OnceValue(func() prometheus.Metric {
		c, err := v.GetMetricWithLabelValues(labels...)
		if err != nil {
			panic(err) // the labels are fixed in this file: a bug
		}
		return c
	})}
}

func (c lazyChild) gauge() prometheus.Gauge       { return c.get().(prometheus.Gauge) }
func (c lazyChild) counter() prometheus.Counter   { return c.get().(prometheus.Counter) }
func (c lazyChild) observer() prometheus.Observer { return c.get().(prometheus.Observer) }

// Registry exposes the registry (tests, extra collectors).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves /metrics; each scrape first deletes the per-address series
// of the prefill instances that are gone (pruneAddrSeries).
func (m *Metrics) Handler() http.Handler {
	gather := prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		m.pruneAddrSeries()
		return m.reg.Gather()
	})
	return promhttp.HandlerFor(gather, promhttp.HandlerOpts{Registry: m.reg})
}

// GRPCMethod is the series of a method of the gRPC server, for the
// server's interceptor (server.CallMetrics, through internal/daemon); kind
// is the method's type ("unary", "server_stream", ...). The series of every
// method InitializeGRPC saw are cached; any other is looked up by labels.
func (m *Metrics) GRPCMethod(fullMethod, kind string) *GRPCMethod {
	return m.grpc.lookup(fullMethod, kind)
}

// InitializeGRPC pre-registers every method's series at zero and caches
// them for the interceptors; call it once, after registering the services
// and before serving.
func (m *Metrics) InitializeGRPC(s *grpc.Server) { m.grpc.initialize(s) }

// Attach gives the scrape-time collectors the manager to read.
func (m *Metrics) Attach(mgr *kvmanager.Manager) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.manager = mgr
	// Create the series whose labels are known up front at 0, so that
	// dashboards and alerts see them before the first event.
	for p := kvmanager.PhaseWaitingPrefill; p <= kvmanager.PhaseHeld; p++ {
		m.rooms.WithLabelValues(p.String())
		if !p.Terminal() {
			m.failedByPhase.WithLabelValues(p.String())
		}
	}
	stats := mgr.ShardStats()
	m.admitted = make([]prometheus.Counter, len(stats))
	for i, st := range stats {
		s := strconv.Itoa(st.Shard)
		m.admitted[i] = m.admissionPasses.WithLabelValues(s)
		for b := prealloc.BlockRetracted; b <= prealloc.BlockDraining; b++ {
			m.admissionBlocked.WithLabelValues(s, b.String())
		}
	}
	for r := kvmanager.DPRuleHint; r <= kvmanager.DPRuleBinding; r++ {
		c := m.dpResolutions.WithLabelValues(r.String())
		if int(r) < len(m.dpByRule) {
			m.dpByRule[r] = c
		}
	}
	for _, o := range []string{"ok", "failed"} {
		m.chunks.WithLabelValues(o)
	}
	m.finished.WithLabelValues("succeeded", "none")
	for c := kvmanager.FailureAborted; c <= kvmanager.FailureDeadlineExceeded; c++ {
		m.finished.WithLabelValues("failed", c.String())
	}
	for _, r := range []string{"false", "true"} {
		m.registrations.WithLabelValues(r)
	}
}

// RoomPhase implements kvmanager.Observer.
func (m *Metrics) RoomPhase(from, to kvmanager.Phase) {
	if from != kvmanager.PhaseUnspecified {
		m.phaseGauge(from).Dec()
	}
	m.phaseGauge(to).Inc()
	if to == kvmanager.PhaseFailed {
		if from >= 0 && int(from) < len(m.failedIn) {
			m.failedIn[from]().Inc()
		} else {
			m.failedByPhase.WithLabelValues(from.String()).Inc()
		}
		if m.sglang != nil {
			m.sglang.roomFailed(from)
		}
	}
}

func (m *Metrics) phaseGauge(p kvmanager.Phase) prometheus.Gauge {
	if p >= 0 && int(p) < len(m.roomsByPhase) {
		return m.roomsByPhase[p]()
	}
	return m.rooms.WithLabelValues(p.String())
}

// RoomForgotten implements kvmanager.Observer.
func (m *Metrics) RoomForgotten(p kvmanager.Phase) { m.phaseGauge(p).Dec() }

// RoomFinished implements kvmanager.Observer.
func (m *Metrics) RoomFinished(outcome kvmanager.Phase, code kvmanager.FailureCode, d time.Duration) {
	if outcome != kvmanager.PhaseFailed {
		m.succeeded().Inc()
		m.handoffOK().Observe(d.Seconds())
		return
	}
	if code >= 0 && int(code) < len(m.failedBy) {
		m.failedBy[code]().Inc()
	} else {
		m.finished.WithLabelValues("failed", code.String()).Inc()
	}
	m.handoffFailed().Observe(d.Seconds())
}

// DestinationLatency implements kvmanager.Observer.
func (m *Metrics) DestinationLatency(d time.Duration) { m.openToDest.Observe(d.Seconds()) }

// TransferLatency implements kvmanager.Observer.
func (m *Metrics) TransferLatency(d time.Duration, bytes uint64) {
	s := d.Seconds()
	m.destToSuccess.Observe(s)
	if bytes > 0 && s > 0 {
		m.transferSpeed.Observe(float64(bytes) / s)
	}
	if m.sglang != nil {
		m.sglang.transferred(s, bytes)
	}
}

// ChunkDone implements kvmanager.Observer.
func (m *Metrics) ChunkDone(bytes int64, d time.Duration, ok bool) {
	count, dur := m.chunksOK, m.chunkOK
	if !ok {
		count, dur = m.chunksFailed, m.chunkFailed
	}
	count().Inc()
	if d >= 0 {
		dur().Observe(d.Seconds())
	}
	if ok && bytes > 0 { // a counter panics on a negative Add
		m.transferBytes.Add(float64(bytes))
	}
}

// DPRankResolved implements kvmanager.Observer.
func (m *Metrics) DPRankResolved(rule kvmanager.DPRule) {
	if int(rule) >= 0 && int(rule) < len(m.dpByRule) && m.dpByRule[rule] != nil {
		m.dpByRule[rule].Inc()
		return
	}
	m.dpResolutions.WithLabelValues(rule.String()).Inc()
}

// DPRankResolvedN implements kvmanager.Observer: n resolutions by one rule.
func (m *Metrics) DPRankResolvedN(rule kvmanager.DPRule, n int) {
	if n <= 0 { // a counter panics on a negative Add
		return
	}
	if int(rule) >= 0 && int(rule) < len(m.dpByRule) && m.dpByRule[rule] != nil {
		m.dpByRule[rule].Add(float64(n))
		return
	}
	m.dpResolutions.WithLabelValues(rule.String()).Add(float64(n))
}

// AdmissionPass implements kvmanager.Observer.
func (m *Metrics) AdmissionPass(shard, admitted int, blocked prealloc.BlockReason) {
	if admitted > 0 {
		if shard >= 0 && shard < len(m.admitted) {
			m.admitted[shard].Add(float64(admitted))
		} else {
			m.admissionPasses.WithLabelValues(strconv.Itoa(shard)).Add(float64(admitted))
		}
	}
	if blocked != prealloc.BlockNone {
		m.admissionBlocked.WithLabelValues(strconv.Itoa(shard), blocked.String()).Inc()
	}
}

// PrefillRegistered implements kvmanager.Observer.
func (m *Metrics) PrefillRegistered(addr string, replaced bool) {
	m.registrations.WithLabelValues(strconv.FormatBool(replaced)).Inc()
}

// PrefillLost implements kvmanager.Observer.
func (m *Metrics) PrefillLost(addr string, rooms int) {
	m.addrEvent(addr)
	m.prefillLost.WithLabelValues(addr).Inc()
}

// HeartbeatMissed implements kvmanager.Observer.
func (m *Metrics) HeartbeatMissed(addr string) {
	m.addrEvent(addr)
	m.heartbeatMisses.WithLabelValues(addr).Inc()
}

// addrEvent records that addr has per-address series.
func (m *Metrics) addrEvent(addr string) {
	m.addrMu.Lock()
	defer m.addrMu.Unlock()
	if m.addrSeries == nil {
		m.addrSeries = map[string]uint64{}
	}
	m.addrSeq++
	m.addrSeries[addr] = m.addrSeq
}

// pruneAddrSeries deletes the per-address series of every address that is
// gone: no prefill instance the manager knows and no room referring to it. The manager is asked without addrMu held (its observer
// calls take addrMu under a shard's lock); an address with an event
// since keeps its series.
func (m *Metrics) pruneAddrSeries() {
	m.mu.Lock()
	mgr := m.manager
	m.mu.Unlock()
	m.addrMu.Lock()
	n := len(m.addrSeries)
	m.addrMu.Unlock()
	if mgr == nil || n == 0 {
		return
	}
	known := map[string]bool{}
	for _, p := range mgr.Status().Prefills {
		known[p.Addr] = true
	}
	m.addrMu.Lock()
	candidates := map[string]uint64{}
	for addr, seq := range m.addrSeries {
		if !known[addr] {
			candidates[addr] = seq
		}
	}
	m.addrMu.Unlock()
	for addr, seq := range candidates {
		if mgr.RoomsFor(addr) > 0 {
			continue
		}
		m.addrMu.Lock()
		if m.addrSeries[addr] == seq {
			delete(m.addrSeries, addr)
			m.heartbeatMisses.DeleteLabelValues(addr)
			m.prefillLost.DeleteLabelValues(addr)
		}
		m.addrMu.Unlock()
	}
}

// ledgerCollector reads every shard's ledger at scrape time.
type ledgerCollector struct{ m *Metrics }

var (
	descPages   = prometheus.NewDesc("decodeplane_kv_pages", "KV pages of a decode DP shard, by state (free, used).", []string{"dp_rank", "state"}, nil)
	descReq     = prometheus.NewDesc("decodeplane_request_slots", "Request (req_to_token) slots, by state.", []string{"dp_rank", "state"}, nil)
	descMeta    = prometheus.NewDesc("decodeplane_metadata_slots", "Metadata (aux) slots, by state.", []string{"dp_rank", "state"}, nil)
	descState   = prometheus.NewDesc("decodeplane_state_slots", "Per-request state slots (Mamba) or SWA pages, by state.", []string{"dp_rank", "state"}, nil)
	descQueue   = prometheus.NewDesc("decodeplane_admission_queue_depth", "Rooms waiting before admission, by stage (waiting: handshake not done; ready: waiting for KV).", []string{"dp_rank", "stage"}, nil)
	descQTokens = prometheus.NewDesc("decodeplane_admission_queue_tokens", "Tokens the rooms waiting before admission would pre-allocate (their prompts), per decode DP shard.", []string{"dp_rank"}, nil)
	descBlock   = prometheus.NewDesc("decodeplane_admission_blocked", "1 for the reason the last admission pass stopped (none when it emptied the queue; resync while admission waits for the decode engine's resync; engine_unreported while a decode engine that owns the pages has not reported its capacity).", []string{"dp_rank", "reason"}, nil)
	descLedger  = prometheus.NewDesc("decodeplane_ledger_rooms", "Rooms in a shard's ledger after admission, by state.", []string{"dp_rank", "state"}, nil)
	descPrefill = prometheus.NewDesc("decodeplane_prefill_instances", "Known prefill instances, by registration completeness.", []string{"state"}, nil)
	descRing    = prometheus.NewDesc("decodeplane_staging_ring_bytes", "Staging ring bytes per decode rank, by state (used: allocated and not yet scattered; free).", []string{"dp_rank", "tp_rank", "state"}, nil)
	descRegions = prometheus.NewDesc("decodeplane_staging_ring_regions", "Live staging regions per decode rank (allocated, not yet freed).", []string{"dp_rank", "tp_rank"}, nil)
	descPending = prometheus.NewDesc("decodeplane_pending_claims", "Prefill claims (AwaitDestination, session claims) waiting for rooms not opened yet; at 8192 new ones are refused.", nil, nil)
)

func (c ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPages, descReq, descMeta, descState, descQueue, descQTokens, descBlock, descLedger, descPrefill, descRing, descRegions, descPending} {
		ch <- d
	}
}

func (c ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	mgr := c.m.attached()
	if mgr == nil {
		return
	}
	g := func(d *prometheus.Desc, v int64, labels ...string) { gauge(ch, d, v, labels...) }
	// The head-of-line reason as GetStatus and the capacity feed read it
	// (Manager.Capacity): the ledger's, or "resync" while admission waits
	// for the engine's resync, or "engine_unreported" before an engine that
	// owns the pages first reported its capacity.
	caps := mgr.Capacity()
	for _, st := range mgr.ShardStats() {
		s := strconv.Itoa(st.Shard)
		blocked := st.LastBlocked.String()
		if st.Shard >= 0 && st.Shard < len(caps) {
			blocked = caps[st.Shard].BlockedBy
		}
		g(descPages, st.Pages.Free, s, "free")
		g(descPages, st.Pages.Used, s, "used")
		g(descReq, st.ReqSlots.Free, s, "free")
		g(descReq, st.ReqSlots.Used, s, "used")
		g(descMeta, st.MetaSlots.Free, s, "free")
		g(descMeta, st.MetaSlots.Used, s, "used")
		if st.MambaSlots.Total+st.SWAPages.Total > 0 {
			g(descState, st.MambaSlots.Free+st.SWAPages.Free, s, "free")
			g(descState, st.MambaSlots.Used+st.SWAPages.Used, s, "used")
		}
		g(descQueue, int64(st.Waiting), s, "waiting")
		g(descQueue, int64(st.Ready), s, "ready")
		g(descQTokens, st.QueuedTokens, s)
		g(descBlock, 1, s, blocked)
		g(descLedger, int64(st.Admitted), s, "admitted")
		g(descLedger, int64(st.Claimed), s, "claimed")
		g(descLedger, int64(st.Running), s, "running")
		g(descLedger, int64(st.Retracted), s, "retracted")
		g(descLedger, int64(st.Held), s, "held")
	}
	complete, partial := 0, 0
	status := mgr.Status()
	g(descPending, int64(status.PendingClaims))
	for _, p := range status.Prefills {
		if p.Registered >= p.Expected {
			complete++
		} else {
			partial++
		}
	}
	g(descPrefill, int64(complete), "complete")
	g(descPrefill, int64(partial), "registering")
	for _, w := range mgr.StagingWatermarks() {
		dp, tp := strconv.Itoa(w.DecodeDP), strconv.Itoa(w.DecodeTP)
		used := ringUsed(w)
		g(descRing, used, dp, tp, "used")
		g(descRing, w.Size-used, dp, tp, "free")
		g(descRegions, int64(w.Live), dp, tp)
	}
}

// ringUsed is the distance from the watermark (the oldest live region) to
// the allocation head, in bytes: what is allocated and not yet scattered.
func ringUsed(w kvmanager.Watermark) int64 {
	if w.Live == 0 {
		return 0
	}
	used := (w.HeadRound-w.Round)*w.Size + w.Head - w.Tail
	return min(max(used, 0), w.Size)
}

// attached is the room manager the scrape-time collectors read (nil before
// Attach).
func (m *Metrics) attached() *kvmanager.Manager {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.manager
}

// gauge sends one gauge sample of d.
func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v int64, labels ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
}

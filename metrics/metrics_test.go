package metrics_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/metrics"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// metricsDaemon is the whole daemon (internal/testing/daemontest: the real server,
// manager and ledger with Prometheus instrumentation), served over bufconn.
type metricsDaemon struct {
	metrics *metrics.Metrics
	conn    *grpc.ClientConn
	rooms   pb.RoomsClient
	boot    pb.BootstrapClient
}

func startMetricsDaemon(t *testing.T, mods ...func(*kvlayout.Config)) *metricsDaemon {
	t.Helper()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		dec := c.Decode()
		for _, f := range mods {
			f(&dec)
		}
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
	}})
	conn := d.Conn(t)
	return &metricsDaemon{metrics: d.Metrics(), conn: conn, rooms: pb.NewRoomsClient(conn), boot: pb.NewBootstrapClient(conn)}
}

// scrape reads /metrics through the real HTTP handler.
func (d *metricsDaemon) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	d.metrics.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("GET /metrics = %d", rec.Code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// value returns the sample of name whose labels include want (0 if absent).
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

const metricsAddr = "10.1.0.1:8998"

func (d *metricsDaemon) register(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := d.boot.RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: metricsAddr, RankEndpoint: "10.1.0.1:9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"})
	if err != nil {
		t.Fatal(err)
	}
}

// succeed drives one room to success as its prefill rank.
func (d *metricsDaemon) succeed(t *testing.T, ctx context.Context, room uint64) {
	t.Helper()
	if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "rid", BootstrapAddr: metricsAddr, Room: room, PromptLen: 500, MaxNewTokens: 10}); err != nil {
		t.Fatal(err)
	}
	rank := &pb.PrefillRank{BootstrapAddr: metricsAddr}
	st, err := d.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: rank})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Recv()
	if err != nil || ev.GetDestination() == nil {
		t.Fatalf("AwaitDestination(%d) = %v, %v; want a destination", room, ev, err)
	}
	n := uint32(len(ev.GetDestination().GetPageIndices()))
	if _, err := d.rooms.Transfer(ctx, &pb.TransferRequest{Room: room, Rank: rank, NumPages: n, Last: true, Aux: &pb.Aux{RoomMarker: room}}); err != nil {
		t.Fatal(err)
	}
	if ev, err := st.Recv(); err != nil || ev.GetDone() == nil {
		t.Fatalf("after the last chunk, AwaitDestination(%d) = %v, %v; want done", room, ev, err)
	}
}

func TestMetricsMoveAsRoomsFlow(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	before := d.scrape(t)
	if got := value(before, "decodeplane_kv_pages", map[string]string{"state": "used"}); got != 0 {
		t.Fatalf("kv pages used before any room = %v, want 0", got)
	}
	d.register(t, ctx)
	d.succeed(t, ctx, 1)
	d.succeed(t, ctx, 2)
	if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "rid", BootstrapAddr: metricsAddr, Room: 3, PromptLen: 100, MaxNewTokens: 10}); err != nil {
		t.Fatal(err)
	}
	mid := d.scrape(t)
	// 500 tokens on 64-token pages = 8 pages for each succeeded room, and room 3 is admitted: 2 pages.
	if got := value(mid, "decodeplane_kv_pages", map[string]string{"state": "used"}); got != 8+8+2 {
		t.Errorf("kv pages used with two running rooms and one admitted = %v, want 18", got)
	}
	if got := value(mid, "decodeplane_rooms", map[string]string{"phase": "succeeded"}); got != 2 {
		t.Errorf("rooms{phase=succeeded} = %v, want 2", got)
	}
	if _, err := d.rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 3}); err != nil {
		t.Fatal(err)
	}
	for _, r := range []uint64{1, 2} {
		if _, err := d.rooms.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: r}); err != nil {
			t.Fatal(err)
		}
	}
	after := d.scrape(t)
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"decodeplane_rooms_finished_total", map[string]string{"outcome": "succeeded"}, 2},
		{"decodeplane_rooms_finished_total", map[string]string{"outcome": "failed", "reason": "aborted"}, 1},
		{"decodeplane_rooms", map[string]string{"phase": "released"}, 2},
		{"decodeplane_rooms", map[string]string{"phase": "failed"}, 1},
		{"decodeplane_rooms", map[string]string{"phase": "succeeded"}, 0},
		{"decodeplane_chunks_total", map[string]string{"outcome": "ok"}, 2},
		{"decodeplane_dp_rank_resolutions_total", map[string]string{"rule": "single_dp"}, 3},
		{"decodeplane_admission_admitted_total", nil, 3},
		{"decodeplane_prefill_registrations_total", map[string]string{"replaced": "false"}, 1},
		{"decodeplane_prefill_instances", map[string]string{"state": "complete"}, 1},
		{"decodeplane_room_open_to_destination_seconds", nil, 3},
		{"decodeplane_room_destination_to_success_seconds", nil, 2},
		{"decodeplane_room_handoff_duration_seconds", map[string]string{"outcome": "succeeded"}, 2},
		{"decodeplane_kv_pages", map[string]string{"state": "used"}, 0},
		{"decodeplane_request_slots", map[string]string{"state": "used"}, 0},
		{"decodeplane_metadata_slots", map[string]string{"state": "used"}, 0},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "OpenRoom", "grpc_code": "OK"}, 3},
		{"grpc_server_handled_total", map[string]string{"grpc_method": "Transfer", "grpc_code": "OK"}, 2},
	}
	for _, c := range checks {
		if got := value(after, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	// 2 rooms × 500 tokens × 128 KiB per token (32 layers × 2 × 8 heads × 128 × 2 B).
	if got, want := value(after, "decodeplane_transfer_bytes_total", nil), float64(2*500*32*2*8*128*2); got != want {
		t.Errorf("decodeplane_transfer_bytes_total = %v, want %v", got, want)
	}
}

// TestDashboardQueriesExistingMetrics keeps deploy/grafana honest: every
// metric a panel queries must be served by the daemon.
func TestDashboardQueriesExistingMetrics(t *testing.T) {
	d := startMetricsDaemon(t, func(c *kvlayout.Config) { c.Staging.Enabled = true }) // staging rings exist
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d.register(t, ctx)
	d.succeed(t, ctx, 1) // histograms and counters appear once observed
	fams := d.scrape(t)
	raw, err := os.ReadFile("../deploy/grafana/decodeplane-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	name := regexp.MustCompile(`\b(decodeplane_[a-z_]+|sglang:[a-z_]+|grpc_server_[a-z_]+|process_[a-z_]+|go_[a-z_]+)\b`)
	// Series labelled by a prefill address exist only after an event this
	// test does not cause (a lost prefill, a missed heartbeat); state slots
	// only for hybrid pools.
	optional := map[string]bool{
		"decodeplane_prefill_lost_total":               true,
		"decodeplane_prefill_heartbeat_failures_total": true,
		"decodeplane_state_slots":                      true,
		// Failed etcd requests exist only with the etcd registry, once one failed.
		"decodeplane_registry_etcd_errors_total": true,
	}
	queried := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				queried++
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				if fams[base] == nil && !optional[base] {
					t.Errorf("panel %q queries %s, which /metrics does not serve", p.Title, m)
				}
			}
		}
	}
	if queried < 20 {
		t.Fatalf("found only %d metric references in the dashboard; the regexp or the file is wrong", queried)
	}
}

// TestDPResolutionsCountEveryRoom: a lookup is counted once per rule per
// call (DPRankResolvedN), and the count is the number of rooms each rule
// resolved; a refused lookup counts nothing.
func TestDPResolutionsCountEveryRoom(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	d.register(t, ctx)
	res, err := d.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: metricsAddr, Rooms: []uint64{10, 11, 12, 13, 14},
		Hints: []*pb.RoomHint{{Room: 12, DpRank: 0}}})
	if err != nil || len(res.GetResolved()) != 5 {
		t.Fatalf("LookupDPRanks = %v, %v; want 5 resolved", res, err)
	}
	if _, err := d.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: metricsAddr, Rooms: []uint64{20, 21},
		Hints: []*pb.RoomHint{{Room: 21, DpRank: 1}}}); err == nil {
		t.Fatal("LookupDPRanks with a hint out of dp_size 1 succeeded")
	}
	fams := d.scrape(t)
	for rule, want := range map[string]float64{"single_dp": 4, "hint": 1} {
		if got := value(fams, "decodeplane_dp_rank_resolutions_total", map[string]string{"rule": rule}); got != want {
			t.Errorf("decodeplane_dp_rank_resolutions_total{rule=%q} = %v, want %v", rule, got, want)
		}
	}
}

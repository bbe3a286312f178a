package metrics_test

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestGRPCServerMetricsCount: the gRPC server metrics count as
// go-grpc-middleware's interceptors did, through the whole daemon: every
// method's series exist at zero before any call; a unary call counts one
// message received, and one sent only when it succeeds; a stream counts each
// message sent; each call ends in handled_total with its code and in
// handling_seconds; an undecodable request (refused before the metrics)
// counts nothing.
func TestGRPCServerMetricsCount(t *testing.T) {
	d := startMetricsDaemon(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	method := func(name, typ string, extra ...string) map[string]string {
		l := map[string]string{"grpc_service": "decodeplane.v1.Rooms", "grpc_method": name, "grpc_type": typ}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return l
	}
	before := d.scrape(t)
	if !hasSeries(before, "grpc_server_handled_total", method("WatchRoom", "server_stream", "grpc_code", "Unauthenticated")) {
		t.Error("no grpc_server_handled_total series for WatchRoom/Unauthenticated before any call")
	}

	d.register(t, ctx)
	d.succeed(t, ctx, 1) // OpenRoom, AwaitDestination (2 messages), Transfer
	if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "rid", BootstrapAddr: metricsAddr, Room: 1, PromptLen: 500, MaxNewTokens: 10}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("OpenRoom of an open room = %v, want AlreadyExists", err)
	}
	if _, err := d.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Room: 2}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("OpenRoom without a rid = %v, want InvalidArgument", err)
	}
	// Invalid UTF-8 in rid (field 1, sent as a BytesValue's bytes): undecodable, refused before the metrics.
	if err := d.conn.Invoke(ctx, "/decodeplane.v1.Rooms/OpenRoom", wrapperspb.Bytes([]byte{0xff, 0xfe}), &pb.OpenRoomResponse{}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("undecodable OpenRoom = %v, want InvalidArgument", err)
	}
	w, err := d.rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: 1, History: true})
	if err != nil {
		t.Fatal(err)
	}
	events := 0
	for {
		ev, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		events++
		if ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			break
		}
	}
	// The watch ends with the release: the room is terminal.
	if _, err := d.rooms.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 1}); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := w.Recv(); err != nil {
			break // the terminal event came, then the end of the stream
		}
		events++
	}

	after := d.scrape(t)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"grpc_server_started_total", method("OpenRoom", "unary"), 3},
		{"grpc_server_msg_received_total", method("OpenRoom", "unary"), 3},
		{"grpc_server_msg_sent_total", method("OpenRoom", "unary"), 1},
		{"grpc_server_handled_total", method("OpenRoom", "unary", "grpc_code", "OK"), 1},
		{"grpc_server_handled_total", method("OpenRoom", "unary", "grpc_code", "AlreadyExists"), 1},
		{"grpc_server_handled_total", method("OpenRoom", "unary", "grpc_code", "InvalidArgument"), 1},
		{"grpc_server_started_total", method("AwaitDestination", "server_stream"), 1},
		{"grpc_server_msg_received_total", method("AwaitDestination", "server_stream"), 1},
		{"grpc_server_msg_sent_total", method("AwaitDestination", "server_stream"), 2},
		{"grpc_server_handled_total", method("AwaitDestination", "server_stream", "grpc_code", "OK"), 1},
		{"grpc_server_msg_sent_total", method("WatchRoom", "server_stream"), float64(events)},
		{"grpc_server_handled_total", method("WatchRoom", "server_stream", "grpc_code", "OK"), 1},
		{"grpc_server_msg_sent_total", method("Transfer", "unary"), 1},
	} {
		if got := value(after, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := histogramCount(after, "grpc_server_handling_seconds", method("OpenRoom", "unary")); got != 3 {
		t.Errorf("grpc_server_handling_seconds{OpenRoom} count = %d, want 3", got)
	}
}

func hasSeries(fams map[string]*dto.MetricFamily, name string, want map[string]string) bool {
	for _, m := range fams[name].GetMetric() {
		if labelsMatch(m, want) {
			return true
		}
	}
	return false
}

func histogramCount(fams map[string]*dto.MetricFamily, name string, want map[string]string) uint64 {
	var n uint64
	for _, m := range fams[name].GetMetric() {
		if labelsMatch(m, want) {
			n += m.GetHistogram().GetSampleCount()
		}
	}
	return n
}

func labelsMatch(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

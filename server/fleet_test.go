package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

func fleetCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fleetRank is rank tpRank of a TP-tp prefill instance at addr, with the
// default decode pool's page size and dtype.
func fleetRank(addr, instance string, tp, tpRank uint32) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{
		BootstrapAddr: addr, RankEndpoint: fmt.Sprintf("10.0.0.9:%d", 17000+tpRank), InstanceId: instance,
		Parallel: &pb.ParallelInfo{AttnTpSize: tp, AttnTpRank: tpRank, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16",
	}
}

// TestGetFleetMemory: with the memory registry a whole daemon on a real
// socket lists itself (its served address, incarnation, version, start and
// layout as GetStatus gives them) and the prefill instances registered with
// it, sorted, alive by heartbeat, heard here, registered through it.
func TestGetFleetMemory(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{TCP: true, Daemon: daemon.Options{Version: "v-fleet"}})
	conn := d.Conn(t)
	ctx := fleetCtx(t)
	boot, fleet := pb.NewBootstrapClient(conn), pb.NewFleetClient(conn)

	empty, err := fleet.GetFleet(ctx, &pb.GetFleetRequest{})
	if err != nil {
		t.Fatalf("GetFleet: %v", err)
	}
	if len(empty.GetPrefills()) != 0 || len(empty.GetDaemons()) != 1 {
		t.Fatalf("GetFleet before any registration = %v; want this daemon alone", empty)
	}

	before := time.Now()
	// Registered out of order: the answer is sorted by bootstrap_addr.
	for _, r := range []*pb.RegisterPrefillRequest{fleetRank("10.0.0.2:8998", "", 1, 0), fleetRank("10.0.0.1:8998", "inst-a", 2, 1)} {
		if _, err := boot.RegisterPrefill(ctx, r); err != nil {
			t.Fatalf("RegisterPrefill(%s): %v", r.GetBootstrapAddr(), err)
		}
	}
	after := time.Now()
	st, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := fleet.GetFleet(ctx, &pb.GetFleetRequest{})
	if err != nil {
		t.Fatalf("GetFleet: %v", err)
	}
	self := d.Addr // the loopback host:port the daemon serves on
	// The default layout's fingerprint; the two instances registered here,
	// so this daemon's check accepted them: they hand off to its digest.
	fp := &pb.Fingerprint{PageSize: 64, KvCacheDtype: "bf16", KvPoolKind: "gqa", NumLayers: 32, TotalKvHeads: 8, HeadDim: 128, PageOwner: "daemon",
		Digest: kvlayout.Fingerprint{PageSize: 64, DType: "bf16", Kind: kvlayout.KindGQA, NumLayers: 32, TotalKVHeads: 8, HeadDim: 128, Owner: kvlayout.OwnerDaemon}.Digest()}
	want := &pb.GetFleetResponse{
		Registry: &pb.RegistryState{Backend: "memory", State: "ok", Since: st.GetStartedAt()},
		Daemons: []*pb.FleetDaemon{{
			Address: self, Incarnation: d.Incarnation(), Self: true, Version: "v-fleet",
			StartedAt: st.GetStartedAt(), Layout: st.GetLayout(), Fingerprint: fp,
		}},
		Prefills: []*pb.FleetPrefill{
			{BootstrapAddr: "10.0.0.1:8998", InstanceId: "inst-a", RegisteredRanks: 1, ExpectedRanks: 2, AttnTpSize: 2, DpSize: 1, PpSize: 1, AttnCpSize: 1, Liveness: "heartbeat", RegisteredVia: self,
				HandOffDigests: []string{fp.GetDigest()}},
			{BootstrapAddr: "10.0.0.2:8998", RegisteredRanks: 1, ExpectedRanks: 1, AttnTpSize: 1, DpSize: 1, PpSize: 1, AttnCpSize: 1, Liveness: "heartbeat", RegisteredVia: self,
				HandOffDigests: []string{fp.GetDigest()}},
		},
	}
	if d.Incarnation() == 0 {
		t.Fatal("the daemon has no incarnation")
	}
	for _, p := range resp.GetPrefills() {
		heard := p.GetHeardHere().AsTime()
		if !p.GetHeardHere().IsValid() || heard.Before(before.Truncate(time.Microsecond)) || heard.After(after) {
			t.Errorf("%s heard_here %v, want within [%s, %s] (its registration)", p.GetBootstrapAddr(), p.GetHeardHere(), before, after)
		}
	}
	if diff := cmp.Diff(want, resp, protocmp.Transform(), protocmp.IgnoreFields(&pb.FleetPrefill{}, "heard_here"), protocmp.IgnoreFields(&pb.FleetDaemon{}, "capacity")); diff != "" {
		t.Errorf("GetFleet (-want +got):\n%s", diff)
	}
	// The daemon's own capacity is read at the call (Server.Capacity).
	if c := resp.GetDaemons()[0].GetCapacity(); c.GetIncarnation() != d.Incarnation() || c.GetAddress() != self || len(c.GetShards()) != 1 || c.GetShards()[0].GetTokensTotal() == 0 ||
		!proto.Equal(c.GetFingerprint(), fp) {
		t.Errorf("the daemon's capacity in GetFleet: %v", c)
	}

	// A heartbeat moves heard_here.
	old := resp.GetPrefills()[1].GetHeardHere().AsTime()
	if _, err := boot.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: &pb.PrefillRank{BootstrapAddr: "10.0.0.2:8998"}}); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	resp, err = fleet.GetFleet(ctx, &pb.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetPrefills()[1].GetHeardHere().AsTime(); !got.After(old) {
		t.Errorf("heard_here %s after a heartbeat, want later than the registration's %s", got, old)
	}
}

// fleetServer serves a server built with deps (no room manager) on a
// loopback socket and dials it.
func fleetServer(t *testing.T, token string, deps server.Deps) (*server.Server, *grpc.ClientConn, string) {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.AuthToken = token
	deps.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	deps.Layout = kvlayout.DefaultConfig().Layout()
	srv, err := server.New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx, nil); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return srv, conn, lis.Addr().String()
}

// TestGetFleetAddressAndToken: the daemon goes by Deps.AdvertiseAddress
// when set, else by the address it serves on; GetFleet needs the token
// when one is configured (fleet.proto: UNAUTHENTICATED).
func TestGetFleetAddressAndToken(t *testing.T) {
	ctx := fleetCtx(t)
	srv, conn, served := fleetServer(t, "", server.Deps{Incarnation: 7})
	resp, err := pb.NewFleetClient(conn).GetFleet(ctx, &pb.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetDaemons()[0].GetAddress(); got != served || srv.Address() != served {
		t.Errorf("address %q (Server.Address %q), want the served %q", got, srv.Address(), served)
	}

	_, conn, _ = fleetServer(t, "tok-f1", server.Deps{AdvertiseAddress: "decode-0.fleet:7600"})
	fc := pb.NewFleetClient(conn)
	if _, err := fc.GetFleet(ctx, &pb.GetFleetRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("GetFleet without the token = %v, want Unauthenticated", err)
	}
	resp, err = fc.GetFleet(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer tok-f1"), &pb.GetFleetRequest{})
	if err != nil {
		t.Fatalf("GetFleet with the token: %v", err)
	}
	if d := resp.GetDaemons(); len(d) != 1 || d[0].GetAddress() != "decode-0.fleet:7600" || !d[0].GetSelf() || len(resp.GetPrefills()) != 0 {
		t.Errorf("GetFleet with AdvertiseAddress = %v; want decode-0.fleet:7600 alone, self, no prefills (no room manager)", resp)
	}
}

// view is a FleetView answering what it is given.
type view struct {
	resp *pb.GetFleetResponse
	err  error
}

func (v view) GetFleet(context.Context) (*pb.GetFleetResponse, error) {
	return proto.CloneOf(v.resp), v.err
}

func (v view) PrefillLease(string) (int64, time.Time, string, bool) { return 0, time.Time{}, "", false }

// TestGetFleetFromView: with Deps.Fleet the answer is the view's, sorted
// and bounded at server.MaxFleetEntries per list; the view's errors keep
// their code, and a view answering nothing is Internal.
func TestGetFleetFromView(t *testing.T) {
	ctx := fleetCtx(t)
	n := server.MaxFleetEntries + 5
	big := &pb.GetFleetResponse{Registry: &pb.RegistryState{Backend: "etcd", State: "degraded", Reason: "etcd unreachable", Revision: 42}}
	for i := range n { // descending: the server sorts
		big.Prefills = append(big.Prefills, &pb.FleetPrefill{BootstrapAddr: fmt.Sprintf("10.1.%03d.%03d:8998", (n-i)/1000, (n-i)%1000), Liveness: "lease", LeaseId: int64(i + 1)})
	}
	big.Daemons = []*pb.FleetDaemon{{Address: "c:7600"}, {Address: "a:7600", Self: true}, {Address: "b:7600"}}

	_, conn, _ := fleetServer(t, "", server.Deps{Fleet: view{resp: big}})
	resp, err := pb.NewFleetClient(conn).GetFleet(ctx, &pb.GetFleetRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.GetRegistry(), big.GetRegistry()) {
		t.Errorf("registry %v, want the view's %v", resp.GetRegistry(), big.GetRegistry())
	}
	var addrs []string
	for _, d := range resp.GetDaemons() {
		addrs = append(addrs, d.GetAddress())
	}
	if !cmp.Equal(addrs, []string{"a:7600", "b:7600", "c:7600"}) || !resp.GetDaemons()[0].GetSelf() {
		t.Errorf("daemons %q, want sorted by address, a:7600 self", addrs)
	}
	p := resp.GetPrefills()
	if len(p) != server.MaxFleetEntries || !resp.GetTruncated() {
		t.Fatalf("%d prefills, truncated %v; want %d, truncated", len(p), resp.GetTruncated(), server.MaxFleetEntries)
	}
	for i := 1; i < len(p); i++ {
		if p[i-1].GetBootstrapAddr() >= p[i].GetBootstrapAddr() {
			t.Fatalf("prefills %d and %d out of order: %s, %s", i-1, i, p[i-1].GetBootstrapAddr(), p[i].GetBootstrapAddr())
		}
	}
	if first := p[0].GetBootstrapAddr(); first != "10.1.000.001:8998" || p[0].GetLeaseId() != int64(n) {
		t.Errorf("first prefill %s (lease %d), want 10.1.000.001:8998 (lease %d): the smallest addresses are kept", first, p[0].GetLeaseId(), n)
	}

	for _, tt := range []struct {
		v    view
		code codes.Code
	}{
		{view{err: status.Error(codes.Unavailable, "registry degraded")}, codes.Unavailable},
		{view{err: context.DeadlineExceeded}, codes.DeadlineExceeded},
		{view{err: errors.New("a bug")}, codes.Internal},
		{view{}, codes.Internal}, // nil answer, nil error
	} {
		_, conn, _ := fleetServer(t, "", server.Deps{Fleet: tt.v})
		if _, err := pb.NewFleetClient(conn).GetFleet(ctx, &pb.GetFleetRequest{}); status.Code(err) != tt.code {
			t.Errorf("GetFleet with a view answering %v = %v, want %s", tt.v.err, err, tt.code)
		}
	}
}

package fleet_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// These tests run whole in-process daemons (internal/testing/daemontest: the real
// composition root, gRPC over bufconn) sharing one real etcd
// (internal/testing/etcdtest, embedded, over TCP). What they wait for arrives
// through etcd's watch, so they poll the daemons' state with a deadline
// (waitFor) where no stream reports it.

const prefillAddr = "10.0.0.1:8998"

type member struct {
	*daemontest.Daemon
	c *client.Client
}

// startMember starts a daemon of the fleet on e, advertised as addr.
func startMember(t *testing.T, e *etcdtest.Server, addr string, ttl time.Duration) *member {
	t.Helper()
	return startMemberWith(t, e, addr, ttl, nil)
}

// startMemberWith is startMember with mod applied to the configuration.
func startMemberWith(t *testing.T, e *etcdtest.Server, addr string, ttl time.Duration, mod func(*config.Config)) *member {
	t.Helper()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		if mod != nil {
			defer mod(c)
		}
		c.Timeouts.HeartbeatInterval = 2 * time.Second
		c.Registry.Backend = fleet.BackendEtcd
		c.Registry.Etcd.Endpoints = e.Endpoint()
		c.Registry.Etcd.AdvertiseAddress = addr
		c.Registry.Etcd.Prefix = "/test/"
		c.Registry.Etcd.LeaseTTL = ttl
		c.Registry.Etcd.RequestTimeout = min(time.Second, ttl/3)
		c.Registry.Etcd.DialTimeout = time.Second
	}})
	c, err := client.New(daemontest.Target, client.WithDialOptions(d.Dialer()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	m := &member{Daemon: d, c: c}
	waitFor(t, addr+": registry ok", func() bool { deg, _, _ := d.Fleet().State(); return !deg })
	return m
}

// waitFor polls cond every 20 ms for at most 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rank(instanceID string) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{
		BootstrapAddr: prefillAddr, RankEndpoint: "10.0.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: instanceID,
	}
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func openRoom(t *testing.T, ctx context.Context, m *member, room uint64) {
	t.Helper()
	if _, err := m.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r", BootstrapAddr: prefillAddr, Room: room, PromptLen: 256, MaxNewTokens: 16}); err != nil {
		t.Fatalf("OpenRoom(%d): %v", room, err)
	}
}

// TestRegisteredThroughOneResolvedByOthers: a prefill registers through
// daemon A only; a room opened on B before the registration waits for it
// and, once the registration arrives through etcd, is delivered and
// succeeds on B. A third daemon started later learns it from the snapshot.
func TestRegisteredThroughOneResolvedByOthers(t *testing.T) {
	e := etcdtest.Start(t)
	a := startMember(t, e, "10.9.0.1:7600", 30*time.Second)
	b := startMember(t, e, "10.9.0.2:7600", 30*time.Second)
	ctx := ctxFor(t, 30*time.Second)

	openRoom(t, ctx, b, 1) // waits for the prefill's registration
	if _, err := a.c.Prefill(rank("p1")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B knows the prefill", func() bool { _, _, err := b.Manager().Heartbeat(kvmanagerRank(), "p1"); return err == nil })
	if _, err := b.c.Prefill(rank("p1")).SendRoom(ctx, 1, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom through B of a prefill registered through A: %v", err)
	}
	r, err := b.c.Engine().WaitRoom(ctx, 1, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
	if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room on B: %v %v", r.GetPhase(), err)
	}

	c := startMember(t, e, "10.9.0.3:7600", 30*time.Second)
	openRoom(t, ctx, c, 2)
	if _, err := c.c.Prefill(rank("p1")).SendRoom(ctx, 2, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom through C (started after the registration): %v", err)
	}

	f, err := c.Fleet().GetFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.GetDaemons()) != 3 || len(f.GetPrefills()) != 1 {
		t.Fatalf("GetFleet on C: %d daemons, %d prefills; want 3 and 1:\n%v", len(f.GetDaemons()), len(f.GetPrefills()), f)
	}
	p := f.GetPrefills()[0]
	if p.GetInstanceId() != "p1" || p.GetRegisteredVia() != "10.9.0.1:7600" || p.GetLeaseId() == 0 || p.GetRegisteredRanks() != 1 || p.GetExpectedRanks() != 1 {
		t.Fatalf("prefill in C's view: %v", p)
	}
	for _, d := range f.GetDaemons() {
		if d.GetIncarnation() == 0 || d.GetLayout().GetPageSize() != 64 {
			t.Fatalf("daemon record: %v", d)
		}
	}
	// Every daemon publishes its capacity (registry.etcd.capacity_interval
	// 1s) on its lease: A's, read from C's view, names A and its shard.
	waitFor(t, "A's capacity in C's view", func() bool {
		f, _ := c.c.Admin().GetFleet(ctx)
		for _, d := range f.GetDaemons() {
			if d.GetAddress() == "10.9.0.1:7600" && len(d.GetCapacity().GetShards()) == 1 {
				return d.GetCapacity().GetAddress() == "10.9.0.1:7600" && d.GetCapacity().GetShards()[0].GetTokensTotal() > 0 &&
					d.GetCapacity().GetIncarnation() == d.GetIncarnation()
			}
		}
		return false
	})
}

// TestLeaseExpiryFailsRooms: a prefill that heartbeats to no daemon loses
// its lease after registry.etcd.lease_ttl; every daemon fails its rooms as
// for a lost heartbeat, and the message says it was the lease.
func TestLeaseExpiryFailsRooms(t *testing.T) {
	e := etcdtest.Start(t)
	const ttl = 5 * time.Second
	a := startMember(t, e, "10.9.0.1:7600", ttl)
	b := startMember(t, e, "10.9.0.2:7600", ttl)
	ctx := ctxFor(t, 40*time.Second)
	if _, err := a.c.Prefill(rank("p1")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B knows the prefill", func() bool { f, _ := b.Fleet().GetFleet(ctx); return len(f.GetPrefills()) == 1 })
	openRoom(t, ctx, b, 7)
	start := time.Now()
	r, err := b.c.Engine().WaitRoom(ctx, 7, pb.RoomPhase_ROOM_PHASE_FAILED)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.GetFailure().GetCode(); got != pb.FailureCode_FAILURE_CODE_PREFILL_LOST {
		t.Fatalf("failure code %v, want PREFILL_LOST (%v)", got, r.GetFailure())
	}
	if msg := r.GetFailure().GetMessage(); !strings.Contains(msg, "lease expired") || !strings.Contains(msg, prefillAddr) || !strings.Contains(msg, "registry.etcd.lease_ttl 5s") {
		t.Fatalf("failure message %q does not say the lease expired", msg)
	}
	if waited := time.Since(start); waited > 3*ttl {
		t.Fatalf("the room failed %s after it opened; the lease is %s", waited, ttl)
	}
	// A is told too: the instance left its view and its registry.
	waitFor(t, "A forgets the prefill", func() bool {
		f, _ := a.Fleet().GetFleet(ctx)
		_, _, err := a.Manager().Heartbeat(kvmanagerRank(), "p1")
		return len(f.GetPrefills()) == 0 && err != nil
	})
}

// TestFailoverKeepsTheLease: the daemon a prefill heartbeats to dies; the
// Go client's RunHeartbeatFailover moves the beats to another daemon; the
// instance keeps its lease (the same lease id) for several TTLs after the
// dead daemon's last keepalive, and its rooms on a third daemon go on.
func TestFailoverKeepsTheLease(t *testing.T) {
	e := etcdtest.Start(t)
	const ttl = 5 * time.Second
	a := startMember(t, e, "10.9.0.1:7600", ttl)
	b := startMember(t, e, "10.9.0.2:7600", ttl)
	c := startMember(t, e, "10.9.0.3:7600", ttl)
	ctx := ctxFor(t, 60*time.Second)
	viaA := a.c.Prefill(rank("p1"), client.HeartbeatEvery(time.Second))
	viaB := b.c.Prefill(rank("p1"), client.HeartbeatEvery(time.Second))
	if _, err := viaA.Register(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*member{b, c} {
		waitFor(t, "B and C know the prefill", func() bool { _, _, err := m.Manager().Heartbeat(kvmanagerRank(), "p1"); return err == nil })
	}
	f, err := c.c.Admin().GetFleet(ctx)
	if err != nil || len(f.GetPrefills()) != 1 {
		t.Fatalf("GetFleet: %v %v", f, err)
	}
	lease := f.GetPrefills()[0].GetLeaseId()
	openRoom(t, ctx, c, 9)
	hctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	started := time.Now()
	go func() { done <- client.RunHeartbeatFailover(hctx, viaA, viaB) }()
	defer func() { stop(); <-done }()

	waitFor(t, "a beat through A", func() bool {
		f, _ := a.c.Admin().GetFleet(ctx)
		return len(f.GetPrefills()) == 1 && f.GetPrefills()[0].GetHeardHere().AsTime().After(started)
	})
	if err := a.Stop(); err != nil {
		t.Fatal(err)
	}
	// The property under test is the lease outliving A by several of its
	// TTLs on a real etcd: real time has to pass (beats go through B).
	time.Sleep(3 * ttl)
	if r, err := c.c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 9}); err != nil || r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED {
		t.Fatalf("room on C after its prefill's daemon died: %v %v", r.GetPhase(), err)
	}
	if _, err := c.c.Prefill(rank("p1")).SendRoom(ctx, 9, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom through C: %v", err)
	}
	f, _ = b.c.Admin().GetFleet(ctx)
	if len(f.GetPrefills()) != 1 || f.GetPrefills()[0].GetLeaseId() != lease {
		t.Fatalf("after the fail-over B's view holds %v, want the instance with its lease %x", f.GetPrefills(), lease)
	}
	if heard := f.GetPrefills()[0].GetHeardHere(); !heard.IsValid() || time.Since(heard.AsTime()) > 3*time.Second {
		t.Fatalf("B last heard the prefill at %v: the beats did not move to B", heard)
	}
	for _, d := range f.GetDaemons() {
		if d.GetAddress() == "10.9.0.1:7600" {
			t.Fatalf("the stopped daemon A is still in the fleet: %v", d)
		}
	}
}

// TestEtcdOutage: etcd stops mid-traffic. Rooms keep flowing on the cached
// view; registrations are refused with UNAVAILABLE saying the registry is
// degraded; readiness says so; once etcd is back the view is rebuilt and
// registrations work again.
func TestEtcdOutage(t *testing.T) {
	e := etcdtest.Start(t)
	a := startMember(t, e, "10.9.0.1:7600", 30*time.Second)
	b := startMember(t, e, "10.9.0.2:7600", 30*time.Second)
	ctx := ctxFor(t, 60*time.Second)
	if _, err := a.c.Prefill(rank("p1")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B knows the prefill", func() bool { _, _, err := b.Manager().Heartbeat(kvmanagerRank(), "p1"); return err == nil })
	openRoom(t, ctx, b, 1)
	if _, err := b.c.Prefill(rank("p1")).SendRoom(ctx, 1, client.SendOptions{}); err != nil {
		t.Fatal(err)
	}

	if g := gauge(t, b, "decodeplane_registry_degraded"); g != 0 {
		t.Fatalf("decodeplane_registry_degraded = %v before the outage", g)
	}
	e.Stop()
	waitFor(t, "B degraded", func() bool { deg, _, _ := b.Fleet().State(); return deg })
	if g := gauge(t, b, "decodeplane_registry_degraded"); g != 1 {
		t.Fatalf("decodeplane_registry_degraded = %v during the outage", g)
	}
	st, err := b.c.Admin().Status(ctx)
	if err != nil || !st.GetReady() || !strings.Contains(st.GetReadiness(), "registry degraded") {
		t.Fatalf("status while etcd is down: ready=%v readiness=%q err=%v", st.GetReady(), st.GetReadiness(), err)
	}
	openRoom(t, ctx, b, 2)
	if _, err := b.c.Prefill(rank("p1")).SendRoom(ctx, 2, client.SendOptions{}); err != nil {
		t.Fatalf("a room while etcd is down: %v", err)
	}
	other := rank("p2")
	other.BootstrapAddr = "10.0.0.2:8998"
	_, err = b.c.Prefill(other).Register(ctx)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "registry degraded") {
		t.Fatalf("registration while etcd is down: %v, want UNAVAILABLE registry degraded", err)
	}

	if err := e.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B ok again", func() bool { deg, _, _ := b.Fleet().State(); return !deg })
	if g, r := gauge(t, b, "decodeplane_registry_degraded"), gauge(t, b, "decodeplane_registry_view_rebuilds_total"); g != 0 || r < 1 {
		t.Fatalf("after the outage: degraded %v (want 0), rebuilds %v (want >= 1)", g, r)
	}
	if _, err := b.c.Prefill(other).Register(ctx); err != nil {
		t.Fatalf("registration after etcd is back: %v", err)
	}
	waitFor(t, "A sees the new prefill", func() bool { f, _ := a.Fleet().GetFleet(ctx); return len(f.GetPrefills()) == 2 })
	st, _ = b.c.Admin().Status(ctx)
	if strings.Contains(st.GetReadiness(), "degraded") {
		t.Fatalf("readiness after recovery: %q", st.GetReadiness())
	}
}

// TestReplacedInstance: a new instance id at the same address, registered
// through another daemon, replaces the instance everywhere: rooms of the
// old one fail as replaced, and its old ranks leave the view.
func TestReplacedInstance(t *testing.T) {
	e := etcdtest.Start(t)
	a := startMember(t, e, "10.9.0.1:7600", 30*time.Second)
	b := startMember(t, e, "10.9.0.2:7600", 30*time.Second)
	ctx := ctxFor(t, 30*time.Second)
	if _, err := a.c.Prefill(rank("p1")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A knows p1", func() bool { f, _ := a.Fleet().GetFleet(ctx); return len(f.GetPrefills()) == 1 })
	openRoom(t, ctx, a, 3)
	if _, err := b.c.Prefill(rank("p2")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := a.c.Engine().WaitRoom(ctx, 3, pb.RoomPhase_ROOM_PHASE_FAILED)
	if err != nil || r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || !strings.Contains(r.GetFailure().GetMessage(), "replaced") {
		t.Fatalf("room of the replaced instance on A: %v %v", r.GetFailure(), err)
	}
	waitFor(t, "A's view holds p2 only", func() bool {
		f, _ := a.Fleet().GetFleet(ctx)
		return len(f.GetPrefills()) == 1 && f.GetPrefills()[0].GetInstanceId() == "p2" && f.GetPrefills()[0].GetRegisteredRanks() == 1
	})
}

// TestReattachWhileHeartbeating: the instance's lease ends although its
// ranks heartbeat to daemon A (here: revoked behind the daemons' backs, as
// when A's keepalives did not reach etcd). A re-creates its records under a
// new lease and its room goes on; B, which never heard from it, fails its
// room as lost; then B learns the re-created instance and serves it again.
func TestReattachWhileHeartbeating(t *testing.T) {
	e := etcdtest.Start(t)
	a := startMember(t, e, "10.9.0.1:7600", 30*time.Second)
	b := startMember(t, e, "10.9.0.2:7600", 30*time.Second)
	ctx := ctxFor(t, 40*time.Second)
	if _, err := a.c.Prefill(rank("p1")).Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B knows the prefill", func() bool { _, _, err := b.Manager().Heartbeat(kvmanagerRank(), "p1"); return err == nil })
	openRoom(t, ctx, a, 1)
	openRoom(t, ctx, b, 2)
	f, err := a.c.Admin().GetFleet(ctx)
	if err != nil || len(f.GetPrefills()) != 1 {
		t.Fatalf("GetFleet: %v %v", f, err)
	}
	oldLease := f.GetPrefills()[0].GetLeaseId()
	if _, err := a.c.Prefill(rank("p1")).Heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(oldLease)); err != nil {
		t.Fatal(err)
	}

	r, err := b.c.Engine().WaitRoom(ctx, 2, pb.RoomPhase_ROOM_PHASE_FAILED)
	if err != nil || r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST || !strings.Contains(r.GetFailure().GetMessage(), "lease expired") {
		t.Fatalf("B's room: %v %v", r.GetFailure(), err)
	}
	waitFor(t, "the instance re-created under a new lease", func() bool {
		f, _ := b.c.Admin().GetFleet(ctx)
		return len(f.GetPrefills()) == 1 && f.GetPrefills()[0].GetLeaseId() != oldLease && f.GetPrefills()[0].GetLeaseId() != 0 &&
			f.GetPrefills()[0].GetRegisteredVia() == "10.9.0.1:7600" && f.GetPrefills()[0].GetInstanceId() == "p1"
	})
	if _, err := a.c.Prefill(rank("p1")).SendRoom(ctx, 1, client.SendOptions{}); err != nil {
		t.Fatalf("A's room after the re-attach: %v", err)
	}
	openRoom(t, ctx, b, 3)
	if _, err := b.c.Prefill(rank("p1")).SendRoom(ctx, 3, client.SendOptions{}); err != nil {
		t.Fatalf("a new room on B after the re-attach: %v", err)
	}
}

// gauge reads one unlabelled gauge or counter of a daemon's metrics.
func gauge(t *testing.T, m *member, name string) float64 {
	t.Helper()
	fams, err := m.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, s := range f.GetMetric() {
			if g := s.GetGauge(); g != nil {
				return g.GetValue()
			}
			if c := s.GetCounter(); c != nil {
				return c.GetValue()
			}
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

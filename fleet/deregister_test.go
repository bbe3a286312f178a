package fleet_test

import (
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestDeregisterAcrossTheFleet: a prefill registered through A and
// heartbeating to B stops cleanly through A (Prefill.Close). A fails its
// room at once; B fails its room as soon as the tombstone reaches it,
// well within the lease TTL, with the deregistration as the reason, and
// does not re-create the instance although it heard it moments ago; the
// instance leaves every daemon's view and its lease is revoked.
// GetStatus on B, which never received a heartbeat of the instance
// before, said its liveness is the lease.
func TestDeregisterAcrossTheFleet(t *testing.T) {
	e := etcdtest.Start(t)
	const ttl = 30 * time.Second
	a := startMember(t, e, "10.9.0.1:7600", ttl)
	b := startMember(t, e, "10.9.0.2:7600", ttl)
	ctx := ctxFor(t, 40*time.Second)
	viaA := a.c.Prefill(rank("p1"))
	if _, err := viaA.Register(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "B knows the prefill", func() bool { f, _ := b.Fleet().GetFleet(ctx); return len(f.GetPrefills()) == 1 })

	st, err := b.c.Admin().Status(ctx)
	if err != nil || len(st.GetPrefills()) != 1 {
		t.Fatalf("B's status: %v %v", st.GetPrefills(), err)
	}
	ps := st.GetPrefills()[0]
	if ps.GetLiveness() != "lease" || ps.GetLeaseId() == 0 || ps.GetRegisteredVia() != "10.9.0.1:7600" || ps.GetLastHeartbeat() != nil || ps.GetMissedHeartbeats() != 0 {
		t.Fatalf("B's status of a prefill that never beat to it = %v; want liveness lease, its lease, registered via A, no heartbeat here", ps)
	}
	if _, err := b.c.Prefill(rank("p1")).Heartbeat(ctx); err != nil { // B hears it now: B would re-create a lost instance
		t.Fatal(err)
	}
	if st, _ := b.c.Admin().Status(ctx); st.GetPrefills()[0].GetLastHeartbeat() == nil {
		t.Fatal("B's status shows no heartbeat after one reached B")
	}
	openRoom(t, ctx, a, 1)
	openRoom(t, ctx, b, 2)
	// Both rooms admitted (past their DP rank and the registration's
	// arrival) before the deregistration, so that each one's failure is the
	// deregistration's.
	for _, c := range []struct {
		m    *member
		room uint64
	}{{a, 1}, {b, 2}} {
		if _, err := c.m.c.Engine().WaitRoom(ctx, c.room, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	resp, err := viaA.Deregister(ctx, "scaled down")
	if err != nil || !resp.GetDeregistered() || resp.GetRoomsFailed() != 1 {
		r, _ := a.c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 1})
		t.Fatalf("Deregister through A = %v, %v; want deregistered, A's 1 room failed (room 1 on A: %v)", resp, err, r)
	}
	for _, c := range []struct {
		m    *member
		room uint64
	}{{a, 1}, {b, 2}} {
		r, err := c.m.c.Engine().WaitRoom(ctx, c.room, pb.RoomPhase_ROOM_PHASE_FAILED)
		if err != nil {
			t.Fatal(err)
		}
		if f := r.GetFailure(); f.GetCode() != pb.FailureCode_FAILURE_CODE_PREFILL_LOST ||
			!strings.Contains(f.GetMessage(), "it deregistered (Bootstrap.DeregisterPrefill through 10.9.0.1:7600): scaled down") {
			t.Fatalf("room %d: %v; want PREFILL_LOST naming the deregistration", c.room, f)
		}
	}
	if waited := time.Since(start); waited > ttl/3 {
		t.Fatalf("B's room failed %s after the deregistration; the lease TTL is %s", waited, ttl)
	}
	for _, m := range []*member{a, b} {
		waitFor(t, "the instance leaves every view", func() bool {
			f, _ := m.Fleet().GetFleet(ctx)
			_, _, herr := m.Manager().Heartbeat(kvmanagerRank(), "p1")
			return len(f.GetPrefills()) == 0 && herr != nil
		})
	}
	// The lease was revoked by the deregistration itself (not left to
	// expire): nothing of the instance is left in etcd.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	g, err := cli.Get(ctx, "/test/prefills/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 0 {
		t.Fatalf("etcd still holds %d keys of the deregistered instance (%v)", g.Count, err)
	}
	lease, err := cli.TimeToLive(ctx, clientv3.LeaseID(ps.GetLeaseId()))
	if err != nil || lease.TTL != -1 {
		t.Fatalf("the instance's lease still lives: %v %v", lease, err)
	}
}

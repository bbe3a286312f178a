package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// A fleet: three daemon binaries sharing a real etcd (helpers in
// fleet_helpers_test.go). Each test has its own etcd and key prefix.

// TestFleetE2ERegisteredThroughOne: a prefill registers through daemon A
// only. Rooms opened on B and C before the registration wait for it and,
// once it arrives through etcd, are delivered through B and C and succeed;
// so do rooms opened after it. The registry holds three daemon records,
// each with its daemon's own incarnation, and the instance registered via
// A.
func TestFleetE2ERegisteredThroughOne(t *testing.T) {
	f := startFleet(t, 3)
	a, b, c := f.daemons[0], f.daemons[1], f.daemons[2]
	ctx := fleetCtx(t, 30*time.Second)
	const bootstrap = "10.0.1.1:8998"
	reg := fleetRank(bootstrap, "p1")

	// Before the registration: the rooms wait for the prefill.
	for _, o := range []struct {
		d    *fleetDaemon
		room uint64
	}{{b, 1}, {c, 2}} {
		if ph := fleetOpen(t, ctx, o.d, bootstrap, o.room); ph != pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL {
			t.Fatalf("room %d on %s opened before any registration is %s, want WAITING_PREFILL", o.room, o.d.name, ph)
		}
	}
	if _, err := a.c.Prefill(reg).Register(ctx); err != nil {
		t.Fatalf("Register through A: %v", err)
	}
	viaB, viaC := b.c.Prefill(reg), c.c.Prefill(reg)
	start := time.Now()
	awaitAdmitted(t, ctx, b, 1)
	awaitAdmitted(t, ctx, c, 2)
	t.Logf("registration through A to admission on B and C: %v", time.Since(start).Round(time.Millisecond))
	for _, o := range []struct {
		d    *fleetDaemon
		p    *client.Prefill
		room uint64
	}{{b, viaB, 1}, {c, viaC, 2}} {
		if err := deliver(ctx, o.d, o.p, o.room); err != nil {
			t.Fatal(err)
		}
	}
	// After the registration.
	roomOnce(t, ctx, b, viaB, bootstrap, 3)
	roomOnce(t, ctx, c, viaC, bootstrap, 4)
	for _, d := range []*fleetDaemon{b, c} {
		if fr := failedRooms(t, ctx, d); len(fr) != 0 {
			t.Fatalf("failed rooms on %s: %v", d.name, fr)
		}
	}

	// The registry: three daemons with distinct incarnations, each the
	// daemon's own; the instance created through A.
	recs := f.daemonRecords(t, ctx)
	seen := map[string]string{}
	for _, d := range f.daemons {
		rec, ok := recs[d.addr]
		if !ok {
			t.Fatalf("no record of %s (%s) in etcd: %v", d.name, d.addr, recs)
		}
		st, err := d.c.Admin().Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("%016x", st.GetIncarnation()); st.GetIncarnation() == 0 || rec.Incarnation != want {
			t.Fatalf("%s's record has incarnation %q; its GetStatus says %q", d.name, rec.Incarnation, want)
		}
		if other, dup := seen[rec.Incarnation]; dup {
			t.Fatalf("%s and %s share incarnation %s", other, d.name, rec.Incarnation)
		}
		seen[rec.Incarnation] = d.name
		if rec.Lease == 0 {
			t.Fatalf("%s's record has no lease: %+v", d.name, rec)
		}
	}
	if len(recs) != 3 {
		t.Fatalf("%d daemon records, want 3: %v", len(recs), recs)
	}
	inst, ok := f.instanceRecord(t, ctx, bootstrap)
	if !ok || inst.InstanceID != "p1" || inst.RegisteredVia != a.addr || inst.Lease == 0 {
		t.Fatalf("instance record of %s = %+v (present %v); want p1 registered via A (%s) with a lease", bootstrap, inst, ok, a.addr)
	}
}

// TestFleetE2EKill9HeartbeatDaemon: the daemon the prefill registered with
// and heartbeats to (A) is killed (SIGKILL) while a hand-off runs on B. The
// prefill heartbeats to B instead; two lease TTLs later its instance still
// has the same lease, the interrupted hand-off and the rooms on B and C
// succeed and none failed. A's record stays until its lease expires (a
// killed daemon cannot revoke it) and then leaves.
func TestFleetE2EKill9HeartbeatDaemon(t *testing.T) {
	f := startFleet(t, 3)
	a, b, c := f.daemons[0], f.daemons[1], f.daemons[2]
	ctx := fleetCtx(t, 60*time.Second)
	const bootstrap = "10.0.2.1:8998"
	reg := fleetRank(bootstrap, "p1")
	viaA := a.c.Prefill(reg)
	if _, err := viaA.Register(ctx); err != nil {
		t.Fatal(err)
	}
	beats := startBeater(t, reg, a, b)
	beats.movedTo(t, ctx, a.name)
	viaB, viaC := b.c.Prefill(reg), c.c.Prefill(reg)

	// Room 21 on C is admitted and waits for its KV across the kill.
	fleetOpen(t, ctx, c, bootstrap, 21)
	awaitAdmitted(t, ctx, c, 21)
	// Room 11 on B: a hand-off in progress (the prefill moves the KV
	// itself; chunk 1 of 4 is being moved) when A dies.
	fleetOpen(t, ctx, b, bootstrap, 11)
	awaitAdmitted(t, ctx, b, 11)
	blocked, release := make(chan struct{}), make(chan struct{})
	handOff := make(chan error, 1)
	go func() {
		_, err := viaB.ReportRoom(ctx, 11, client.SendOptions{ChunkPages: 1, Move: func(mctx context.Context, ch client.Chunk) (uint64, error) {
			if ch.Index == 1 {
				close(blocked)
				select {
				case <-release:
				case <-mctx.Done():
					return 0, mctx.Err()
				}
			}
			return ch.Bytes(), nil
		}})
		handOff <- err
	}()
	select {
	case <-blocked:
	case err := <-handOff:
		t.Fatalf("the hand-off on B ended before chunk 1: %v", err)
	}

	before, ok := f.instanceRecord(t, ctx, bootstrap)
	if !ok || before.Lease == 0 || before.RegisteredVia != a.addr {
		t.Fatalf("instance record before the kill: %+v (present %v)", before, ok)
	}
	aRec, ok := f.daemonRecords(t, ctx)[a.addr]
	if !ok {
		t.Fatal("A has no record before the kill")
	}
	a.p.Kill(t, 10*time.Second)
	killed := time.Now()
	if _, ok := f.daemonRecords(t, ctx)[a.addr]; !ok {
		t.Fatal("A's record left at once although A was killed (only a graceful stop revokes its lease)")
	}
	beats.movedTo(t, ctx, b.name)
	t.Logf("kill -9 of A to the first heartbeat through B: %v", time.Since(killed).Round(time.Millisecond))
	close(release)
	if err := <-handOff; err != nil {
		t.Fatalf("the hand-off on B across A's death: %v", err)
	}
	if r, err := b.c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 11}); err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("room 11 on B after the hand-off: %v %v (%v)", r.GetPhase(), err, r.GetFailure())
	}

	// A's record leaves with its lease: not before it could have expired.
	pollUntil(t, 3*fleetLeaseTTL, "A's record to leave etcd", func() (bool, string) {
		_, present := f.daemonRecords(t, ctx)[a.addr]
		return !present, fmt.Sprintf("A's record (lease %x) still present", aRec.Lease)
	})
	goneAfter := time.Since(killed)
	// A kept its lease alive once a second (its session tick): the lease
	// ends between lease_ttl-1s and lease_ttl after the kill, plus etcd's
	// expiry check.
	if goneAfter < fleetLeaseTTL-2*time.Second || goneAfter > 2*fleetLeaseTTL {
		t.Fatalf("A's record left %v after the kill; its lease is %v", goneAfter, fleetLeaseTTL)
	}
	t.Logf("kill -9 of A to its record leaving etcd: %v (lease_ttl %v)", goneAfter.Round(time.Millisecond), fleetLeaseTTL)

	// Two lease TTLs after the kill, the prefill is alive on its first
	// lease, through B's keepalives.
	select {
	case <-time.After(time.Until(killed.Add(2 * fleetLeaseTTL))):
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	after, ok := f.instanceRecord(t, ctx, bootstrap)
	if !ok || after.Lease != before.Lease || after.InstanceID != "p1" {
		t.Fatalf("instance record 2×lease_ttl after A's death: %+v (present %v); want the same lease %x", after, ok, before.Lease)
	}
	if err := deliver(ctx, c, viaC, 21); err != nil {
		t.Fatalf("room 21, admitted on C before the kill: %v", err)
	}
	roomOnce(t, ctx, b, viaB, bootstrap, 12)
	roomOnce(t, ctx, c, viaC, bootstrap, 22)
	for _, d := range []*fleetDaemon{b, c} {
		if fr := failedRooms(t, ctx, d); len(fr) != 0 {
			t.Fatalf("failed rooms on %s: %v", d.name, fr)
		}
	}
	beats.halt()
	ok2, failed := beats.counts()
	// Every beat through B succeeded; at least one per cadence since the
	// move (less the one in flight).
	if len(failed[b.name]) != 0 || ok2[b.name] < int(2*fleetLeaseTTL/fleetBeatEvery)-3 {
		t.Fatalf("heartbeats through B: %d ok, failures %v", ok2[b.name], failed[b.name])
	}
	if len(failed[a.name]) == 0 {
		t.Fatal("no heartbeat through A failed: the test did not kill the daemon the prefill beat to")
	}
	for _, err := range failed[a.name] {
		if !errors.Is(err, client.ErrUnavailable) && !errors.Is(err, client.ErrDeadlineExceeded) {
			t.Fatalf("a heartbeat through the killed A failed with %v, want Unavailable", err)
		}
	}
}

// TestFleetE2EEtcdOutage: etcd stops while rooms flow on B in a loop. The
// rooms keep succeeding on the cached view; a registration through B is
// refused UNAVAILABLE "registry degraded"; B's readiness and /metrics say
// so. etcd starts again: B's view is rebuilt (degraded 0, rebuilds ≥ 1),
// a new prefill registers through C and A resolves it.
func TestFleetE2EEtcdOutage(t *testing.T) {
	f := startFleet(t, 3)
	a, b, c := f.daemons[0], f.daemons[1], f.daemons[2]
	ctx := fleetCtx(t, 60*time.Second)
	const bootstrap = "10.0.3.1:8998"
	reg := fleetRank(bootstrap, "p1")
	viaA := a.c.Prefill(reg)
	if _, err := viaA.Register(ctx); err != nil {
		t.Fatal(err)
	}
	knownBy(t, ctx, b, bootstrap)
	beats := startBeater(t, reg, b)
	beats.movedTo(t, ctx, b.name)
	if v, ok := b.metric("decodeplane_registry_degraded"); !ok || v != 0 {
		t.Fatalf("B's decodeplane_registry_degraded before the outage = %v (found %v), want 0", v, ok)
	}
	rebuildsBefore, _ := b.metric("decodeplane_registry_view_rebuilds_total")

	// The traffic: rooms on B, one after the other, until stopped.
	viaB := b.c.Prefill(reg)
	type result struct {
		room uint64
		at   time.Time
		err  error
	}
	var mu sync.Mutex
	var results []result
	tctx, stopTraffic := context.WithCancel(ctx)
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		pace := time.NewTicker(50 * time.Millisecond) // a room every 50 ms at most: traffic, not a load test
		defer pace.Stop()
		for room := uint64(100); tctx.Err() == nil; room++ {
			err := func() error {
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if _, err := b.c.Engine().OpenRoom(rctx, &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: bootstrap, Room: room, PromptLen: 256, MaxNewTokens: 16}); err != nil {
					return fmt.Errorf("OpenRoom %d on B: %w", room, err)
				}
				if _, err := b.c.Engine().WaitRoom(rctx, room, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
					return fmt.Errorf("room %d on B not admitted: %w", room, err)
				}
				return deliver(rctx, b, viaB, room)
			}()
			mu.Lock()
			results = append(results, result{room, time.Now(), err})
			mu.Unlock()
			select {
			case <-tctx.Done():
			case <-pace.C:
			}
		}
	}()
	defer func() { stopTraffic(); <-trafficDone }()
	succeededSince := func(since time.Time) (ok int, errs []error) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range results {
			if r.err != nil {
				errs = append(errs, r.err)
			} else if r.at.After(since) {
				ok++
			}
		}
		return ok, errs
	}
	pollUntil(t, 20*time.Second, "rooms flowing on B", func() (bool, string) {
		n, errs := succeededSince(time.Time{})
		if len(errs) > 0 {
			t.Fatalf("a room on B failed before the outage: %v", errs)
		}
		return n >= 3, fmt.Sprintf("%d rooms succeeded", n)
	})

	// Stop returns once etcd's drain of the open watches ends (up to its
	// request timeout); it applies nothing from the call on.
	stopped := time.Now()
	stopDone := make(chan struct{})
	go func() { defer close(stopDone); f.etcd.Stop() }()
	pollUntil(t, 20*time.Second, "B's decodeplane_registry_degraded 1", func() (bool, string) {
		v, ok := b.metric("decodeplane_registry_degraded")
		return ok && v == 1, fmt.Sprint(v, ok)
	})
	degradedAt := time.Now()
	t.Logf("etcd stopped to B degraded: %v", degradedAt.Sub(stopped).Round(time.Millisecond))
	st, err := b.c.Admin().Status(ctx)
	if err != nil || !st.GetReady() || !strings.Contains(st.GetReadiness(), "registry degraded") {
		t.Fatalf("B's status while etcd is down: ready %v, readiness %q, %v; want ready and \"registry degraded\"", st.GetReady(), st.GetReadiness(), err)
	}
	const other = "10.0.3.2:8998"
	_, err = b.c.Prefill(fleetRank(other, "p2")).Register(ctx)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "registry degraded") {
		t.Fatalf("RegisterPrefill through B while etcd is down = %v; want UNAVAILABLE \"registry degraded\"", err)
	}
	pollUntil(t, 20*time.Second, "rooms succeeding on B while etcd is down", func() (bool, string) {
		n, errs := succeededSince(degradedAt)
		if len(errs) > 0 {
			t.Fatalf("a room on B failed during the outage: %v", errs)
		}
		return n >= 3, fmt.Sprintf("%d rooms succeeded since B became degraded", n)
	})
	if v, ok := b.metric("decodeplane_registry_degraded"); !ok || v != 1 {
		t.Fatalf("etcd came back by itself? B's decodeplane_registry_degraded = %v (%v)", v, ok)
	}
	outage, _ := succeededSince(degradedAt)

	<-stopDone
	if err := f.etcd.Start(); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	for _, d := range []*fleetDaemon{b, c} {
		pollUntil(t, 20*time.Second, d.name+" recovered", func() (bool, string) {
			deg, ok1 := d.metric("decodeplane_registry_degraded")
			reb, ok2 := d.metric("decodeplane_registry_view_rebuilds_total")
			return ok1 && ok2 && deg == 0 && reb >= rebuildsBefore+1, fmt.Sprintf("degraded %v, rebuilds %v", deg, reb)
		})
	}
	t.Logf("etcd started to B and C recovered: %v", time.Since(restarted).Round(time.Millisecond))
	if st, err := b.c.Admin().Status(ctx); err != nil || strings.Contains(st.GetReadiness(), "degraded") {
		t.Fatalf("B's readiness after recovery: %q %v", st.GetReadiness(), err)
	}
	stopTraffic()
	<-trafficDone
	total, errs := succeededSince(time.Time{})
	if len(errs) > 0 {
		t.Fatalf("rooms on B failed: %v", errs)
	}
	t.Logf("rooms on B: %d succeeded, %d of them while B was degraded", total, outage)
	// The prefill's heartbeats through B went on throughout.
	if ok, failed := beats.counts(); len(failed[b.name]) != 0 || ok[b.name] < 3 {
		t.Fatalf("heartbeats through B across the outage: %d ok, failures %v", ok[b.name], failed[b.name])
	}

	// A new prefill through C, resolved by A (through the rebuilt views).
	reg2 := fleetRank(other, "p2")
	fleetOpen(t, ctx, a, other, 1)
	if _, err := c.c.Prefill(reg2).Register(ctx); err != nil {
		t.Fatalf("Register through C after etcd is back: %v", err)
	}
	awaitAdmitted(t, ctx, a, 1)
	if err := deliver(ctx, a, a.c.Prefill(reg2), 1); err != nil {
		t.Fatal(err)
	}
	if inst, ok := f.instanceRecord(t, ctx, other); !ok || inst.RegisteredVia != c.addr || inst.InstanceID != "p2" {
		t.Fatalf("instance record of %s: %+v (present %v), want p2 via C", other, inst, ok)
	}
	if fr := failedRooms(t, ctx, b); len(fr) != 0 {
		t.Fatalf("failed rooms on B: %v", fr)
	}
}

// TestFleetE2ELeaseExpiry: a prefill registers through A and never
// heartbeats. Its lease expires after lease_ttl; its rooms on B and C fail
// as PREFILL_LOST with a message saying the lease expired, within two
// lease TTLs of the registration; the instance leaves etcd and A.
func TestFleetE2ELeaseExpiry(t *testing.T) {
	f := startFleet(t, 3)
	a, b, c := f.daemons[0], f.daemons[1], f.daemons[2]
	ctx := fleetCtx(t, 60*time.Second)
	const bootstrap = "10.0.4.1:8998"
	reg := fleetRank(bootstrap, "p1")
	registered := time.Now()
	if _, err := a.c.Prefill(reg).Register(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []*fleetDaemon{b, c} {
		fleetOpen(t, ctx, d, bootstrap, 7)
		awaitAdmitted(t, ctx, d, 7)
	}
	for _, d := range []*fleetDaemon{c, b} {
		r, err := d.c.Engine().WaitRoom(ctx, 7, pb.RoomPhase_ROOM_PHASE_FAILED)
		if err != nil {
			t.Fatalf("room 7 on %s: %v", d.name, err)
		}
		failedAfter := time.Since(registered)
		if got := r.GetFailure().GetCode(); got != pb.FailureCode_FAILURE_CODE_PREFILL_LOST {
			t.Fatalf("room 7 on %s failed with %v (%q), want PREFILL_LOST", d.name, got, r.GetFailure().GetMessage())
		}
		msg := r.GetFailure().GetMessage()
		if !strings.Contains(msg, "lease expired") || !strings.Contains(msg, bootstrap) || !strings.Contains(msg, "registry.etcd.lease_ttl 6s") {
			t.Fatalf("room 7 on %s: failure message %q does not say %s's lease (registry.etcd.lease_ttl 6s) expired", d.name, msg, bootstrap)
		}
		// The lease was granted (and kept alive once) at the registration:
		// it cannot end before lease_ttl.
		if failedAfter < fleetLeaseTTL-500*time.Millisecond || failedAfter > 2*fleetLeaseTTL {
			t.Fatalf("room 7 on %s failed %v after the registration; the lease is %v", d.name, failedAfter, fleetLeaseTTL)
		}
		t.Logf("registration to room 7 failing on %s: %v", d.name, failedAfter.Round(time.Millisecond))
	}
	if inst, ok := f.instanceRecord(t, ctx, bootstrap); ok {
		t.Fatalf("the expired instance is still in etcd: %+v", inst)
	}
	pollUntil(t, 10*time.Second, "A to forget the expired instance", func() (bool, string) {
		st, err := a.c.Admin().Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		return !slices.ContainsFunc(st.GetPrefills(), func(p *pb.PrefillStatus) bool { return p.GetBootstrapAddr() == bootstrap }), fmt.Sprint(st.GetPrefills())
	})
	if _, err := a.c.Prefill(reg).Heartbeat(ctx); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("a heartbeat of the expired instance through A = %v, want NotFound (register again)", err)
	}
}

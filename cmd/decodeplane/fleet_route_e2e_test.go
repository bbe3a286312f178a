package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Claim routing end to end: three daemon binaries on one etcd, a prefill
// instance of two ranks registered through daemon A only (each rank a
// client.FleetPrefill seeded with A), and decode engines opening rooms on
// B and C. The prefill is never told which daemon holds a room: each
// daemon offers the rooms it holds on the rank's session with it.

// routeRoomsEnv sets the rooms of TestFleetE2EClaimRouting's flow
// (default routeRoomsShort); TESTING.md records the 10,000-room run.
const (
	routeRoomsEnv   = "DECODEPLANE_FLEET_ROUTE_ROOMS"
	routeRoomsShort = 400
	// routeFailBound is how soon after B's kill -9 the prefill side must
	// have failed B's rooms: the rank's session with B ends at once (the
	// host resets the connection) and a hand-off of B's room fails once
	// B's session could not be opened again under the client's default
	// retry policy (4 attempts, 50 ms doubling: under 1 s, the open the
	// hand-off found in progress included); twice that for a loaded CI
	// machine.
	routeFailBound = 2 * time.Second
)

// routeRooms is the flow's room count.
func routeRooms(t *testing.T) int {
	v := os.Getenv(routeRoomsEnv)
	if v == "" {
		return routeRoomsShort
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number of rooms", routeRoomsEnv, v)
	}
	return n
}

// fastReconnect is a short reconnect back-off, for clients of daemons a
// test kills and restarts.
func fastReconnect() client.Option {
	return client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second}))
}

// routeRank is rank tp of a TP-2 prefill instance at bootstrap.
func routeRank(bootstrap string, tp uint32) *pb.RegisterPrefillRequest {
	host, _, _ := strings.Cut(bootstrap, ":")
	return &pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: fmt.Sprintf("%s:%d", host, 17000+tp),
		Parallel: &pb.ParallelInfo{AttnTpSize: 2, AttnTpRank: tp, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: "p1"}
}

// startRanks runs the instance's two ranks as FleetPrefills seeded with
// seed until the test ends, and waits until each holds a session with
// every daemon of ds.
func startRanks(t *testing.T, seed *fleetDaemon, bootstrap string, ds ...*fleetDaemon) []*client.FleetPrefill {
	t.Helper()
	var ranks []*client.FleetPrefill
	for tp := range uint32(2) {
		fp, err := client.NewFleetPrefill(seed.addr, routeRank(bootstrap, tp), client.FleetClientOptions(fastReconnect()),
			client.FleetRefresh(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- fp.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			<-done
			fp.Close()
		})
		ranks = append(ranks, fp)
	}
	for _, fp := range ranks {
		sessionsUp(t, fp, ds...)
	}
	return ranks
}

// sessionsUp waits until fp holds a session with every daemon of ds.
func sessionsUp(t *testing.T, fp *client.FleetPrefill, ds ...*fleetDaemon) {
	t.Helper()
	pollUntil(t, 20*time.Second, "the rank's sessions with every daemon", func() (bool, string) {
		up := map[string]bool{}
		for _, s := range fp.Daemons() {
			up[s.Address] = s.Session
		}
		for _, d := range ds {
			if !up[d.addr] {
				return false, fmt.Sprint(fp.Daemons())
			}
		}
		return true, ""
	})
}

// routedRoom is one room: opened on d by its decode engine (OpenAndWait,
// then ReleaseRoom) while every rank hands it off (SendRoom, told only the
// room). It returns the first error.
func routedRoom(ctx context.Context, d *fleetDaemon, ranks []*client.FleetPrefill, bootstrap string, room uint64) error {
	errs := make(chan error, 1+len(ranks))
	var wg sync.WaitGroup
	wg.Go(func() {
		r, err := d.c.Engine().OpenAndWait(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: bootstrap, Room: room, PromptLen: 300, MaxNewTokens: 8})
		if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			errs <- fmt.Errorf("room %d on %s: %v (%v)", room, d.name, err, r.GetFailure())
			return
		}
		if _, err := d.c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
			errs <- fmt.Errorf("release room %d on %s: %w", room, d.name, err)
		}
	})
	for _, fp := range ranks {
		wg.Go(func() {
			if _, err := fp.SendRoom(ctx, room, client.SendOptions{ChunkPages: 2, OutputIDs: []int32{1}}); err != nil {
				errs <- fmt.Errorf("SendRoom %d (its room on %s): %w", room, d.name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// flow runs n rooms, spread over ds in turn, concurrency at a time, with
// room ids from next; it returns the rooms that failed.
func flow(ctx context.Context, ds []*fleetDaemon, ranks []*client.FleetPrefill, bootstrap string, next func() uint64, n, concurrency int) []error {
	var mu sync.Mutex
	var failed []error
	var started atomic.Int64
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for {
				i := started.Add(1) - 1
				if i >= int64(n) || ctx.Err() != nil {
					return
				}
				if err := routedRoom(ctx, ds[i%int64(len(ds))], ranks, bootstrap, next()); err != nil {
					mu.Lock()
					failed = append(failed, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return failed
}

// revision is etcd's current revision.
func (f *fleet) revision(t *testing.T, ctx context.Context) int64 {
	t.Helper()
	resp, err := f.kv.Get(ctx, f.prefix+"revision-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// writesBetween classifies every revision after from up to to: by the
// kind of key it wrote under the prefix (daemons/, capacity/, prefills/,
// other). A revision that wrote nothing under the prefix is "outside".
func (f *fleet) writesBetween(t *testing.T, ctx context.Context, from, to int64) map[string]int {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kinds := map[int64]string{}
	for resp := range f.kv.Watch(wctx, f.prefix, clientv3.WithPrefix(), clientv3.WithRev(from+1)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("watch etcd's history from revision %d: %v", from+1, err)
		}
		for _, ev := range resp.Events {
			rev := ev.Kv.ModRevision
			if rev > to {
				continue
			}
			kind, _, _ := strings.Cut(strings.TrimPrefix(string(ev.Kv.Key), f.prefix), "/")
			switch kind {
			case "daemons", "capacity", "prefills":
			default:
				kind = "other: " + string(ev.Kv.Key)
			}
			kinds[rev] = kind
		}
		if resp.Header.Revision >= to {
			break
		}
	}
	out := map[string]int{}
	for rev := from + 1; rev <= to; rev++ {
		k, ok := kinds[rev]
		if !ok {
			k = "outside"
		}
		out[k]++
	}
	return out
}

// TestFleetE2EClaimRouting: three daemons on etcd; a prefill instance of
// two ranks registered through A only; decode engines open rooms on B and
// C. Every room is claimed and succeeds, the prefill told only the room
// (DECODEPLANE_FLEET_ROUTE_ROOMS rooms, default 400), and etcd's revision
// grows only by the registration and the daemons' capacity publications
// (lease keep-alives write nothing). Then kill -9 of B while a hand-off of
// one of its rooms runs and two more are offered: all fail on the prefill
// side within routeFailBound, while C's rooms keep succeeding. B restarts
// on its address as a new incarnation: a chunk naming an old destination
// is refused STALE_INCARNATION, a hand-off of a room of the old B fails
// with an IncarnationChangedError, and new rooms on B succeed.
func TestFleetE2EClaimRouting(t *testing.T) {
	f := startFleet(t, 3)
	a, b, c := f.daemons[0], f.daemons[1], f.daemons[2]
	n := routeRooms(t)
	ctx := fleetCtx(t, 5*time.Minute+time.Duration(n)*10*time.Millisecond)
	const bootstrap = "10.0.9.1:8998"
	rev0, t0 := f.revision(t, ctx), time.Now()
	ranks := startRanks(t, a, bootstrap, a, b, c)
	var ids atomic.Uint64
	next := func() uint64 { return 1000 + ids.Add(1) }

	start := time.Now()
	if failed := flow(ctx, []*fleetDaemon{b, c}, ranks, bootstrap, next, n, 64); len(failed) > 0 {
		t.Fatalf("%d of %d rooms failed; first: %v", len(failed), n, failed[0])
	}
	elapsed := time.Since(start)
	rev1 := f.revision(t, ctx)
	writes := f.writesBetween(t, ctx, rev0, rev1)
	t.Logf("%d rooms on B and C, handed off by 2 ranks registered through A: %v (%.0f rooms/s); etcd revision %d -> %d: %v",
		n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), rev0, rev1, writes)
	// The registration: one transaction per rank. The capacity: each
	// daemon publishes at most once per registry.etcd.capacity_interval
	// (1 s). The daemons' records: each daemon puts its own again with its
	// lease's keep-alive at most once per lease_ttl/3 (the prefill's lease
	// keep-alives write nothing). None of it grows with the rooms.
	secs := int(time.Since(t0)/time.Second) + 1
	capBound, recBound := 3*(secs+1), 3*(secs/int(fleetLeaseTTL/3/time.Second)+1)
	for kind, revs := range writes {
		switch {
		case kind == "prefills" && revs <= 2, kind == "capacity" && revs <= capBound, kind == "daemons" && revs <= recBound:
		default:
			t.Errorf("%d etcd revisions of kind %q over the %d rooms; want only the registration (<= 2 prefills/ writes), capacity (<= %d) and the daemons' records with their lease (<= %d)",
				revs, kind, n, capBound, recBound)
		}
	}

	killAndRestart(t, ctx, f, ranks, bootstrap, next)
}

// killAndRestart is TestFleetE2EClaimRouting's second half.
func killAndRestart(t *testing.T, ctx context.Context, f *fleet, ranks []*client.FleetPrefill, bootstrap string, next func() uint64) {
	b, c := f.daemons[1], f.daemons[2]
	oldInc := incarnationOf(t, ctx, b)
	// C's rooms flow across the kill.
	cctx, stopC := context.WithCancel(ctx)
	var cOK, cAfter atomic.Int64
	var killedAt atomic.Int64
	cErrs := make(chan error, 1024)
	cDone := make(chan struct{})
	go func() {
		defer close(cDone)
		for cctx.Err() == nil {
			err := routedRoom(cctx, c, ranks, bootstrap, next())
			switch {
			case err == nil:
				cOK.Add(1)
				if k := killedAt.Load(); k != 0 {
					cAfter.Add(1)
				}
			case cctx.Err() == nil:
				cErrs <- err
			}
		}
	}()

	// On B: room h in a hand-off (rank 0 moves the KV itself and is
	// moving chunk 1 of 4 when B dies; rank 1 sent its chunks), rooms o1
	// and o2 offered to both ranks and not handed off yet.
	h, o1, o2 := next(), next(), next()
	for _, room := range []uint64{h, o1, o2} {
		fleetOpen(t, ctx, b, bootstrap, room)
	}
	var oldDest atomic.Pointer[pb.Destination]
	blocked, release := make(chan struct{}), make(chan struct{})
	handOffs := make(chan error, 2)
	go func() {
		_, err := ranks[0].ReportRoom(ctx, h, client.SendOptions{ChunkPages: 1, Move: func(mctx context.Context, ch client.Chunk) (uint64, error) {
			if ch.Index == 1 {
				oldDest.Store(ch.Destination)
				close(blocked)
				select {
				case <-release:
				case <-mctx.Done():
					return 0, mctx.Err()
				}
			}
			return ch.Bytes(), nil
		}})
		handOffs <- err
	}()
	go func() {
		_, err := ranks[1].SendRoom(ctx, h, client.SendOptions{ChunkPages: 1})
		handOffs <- err
	}()
	<-blocked
	for _, fp := range ranks {
		for _, room := range []uint64{o1, o2} {
			pollUntil(t, 10*time.Second, fmt.Sprintf("room %d offered by B", room), func() (bool, string) {
				owner, ok := fp.Owner(room)
				return ok && owner == b.addr, owner
			})
		}
	}
	pollUntil(t, 10*time.Second, "C's rooms flowing", func() (bool, string) { return cOK.Load() > 0, "" })

	b.p.Kill(t, 10*time.Second)
	killed := time.Now()
	killedAt.Store(killed.UnixNano())
	close(release)
	var lastFail time.Duration
	for range 2 {
		err := <-handOffs
		lastFail = max(lastFail, time.Since(killed))
		if !bGone(err) {
			t.Fatalf("a hand-off of room %d, on B when it was killed, ended with %v; want B unreachable or the room's failure", h, err)
		}
	}
	offered := make(chan error, 4)
	var took atomic.Int64 // the longest, in nanoseconds after the kill
	for _, fp := range ranks {
		for _, room := range []uint64{o1, o2} {
			go func() {
				_, err := fp.SendRoom(ctx, room, client.SendOptions{})
				for d := int64(time.Since(killed)); ; {
					if cur := took.Load(); d <= cur || took.CompareAndSwap(cur, d) {
						break
					}
				}
				if !bGone(err) {
					err = fmt.Errorf("the hand-off of room %d, offered by B before its kill, = %w; want B unreachable", room, err)
				} else {
					err = nil
				}
				offered <- err
			}()
		}
	}
	for range 4 {
		if err := <-offered; err != nil {
			t.Fatal(err)
		}
	}
	lastFail = max(lastFail, time.Duration(took.Load()))
	if lastFail > routeFailBound {
		t.Fatalf("B's rooms failed on the prefill side %v after its kill -9; the bound is %v", lastFail, routeFailBound)
	}
	t.Logf("kill -9 of B to the last of its rooms failed on the prefill side: %v", lastFail.Round(time.Millisecond))

	// B restarts on its address: a new incarnation.
	restarted := f.restartAt(t, b)
	newInc := incarnationOf(t, ctx, restarted)
	if newInc == oldInc {
		t.Fatalf("B restarted with its old incarnation %x", oldInc)
	}
	for _, fp := range ranks {
		sessionsUp(t, fp, restarted)
	}
	d := oldDest.Load()
	_, err := restarted.c.Prefill(routeRank(bootstrap, 0)).ReportTransfer(ctx, &pb.ReportTransferRequest{Room: h, ChunkIndex: 1, PageOffset: 1, NumPages: 1,
		Success: true, Bytes: 1, Attempt: d.GetAttempt(), Incarnation: d.GetIncarnation()})
	if named, daemon, ok := client.StaleIncarnation(err); status.Code(err) != codes.FailedPrecondition || !ok || named != oldInc || daemon != newInc {
		t.Fatalf("a report naming the old B's destination = %v; want FAILED_PRECONDITION STALE_INCARNATION (%x, daemon %x)", err, oldInc, newInc)
	}
	if _, err := ranks[0].SendRoom(ctx, o1, client.SendOptions{}); !errors.Is(err, client.ErrIncarnationChanged) {
		t.Fatalf("a hand-off of room %d of the old B after its restart = %v; want an IncarnationChangedError", o1, err)
	}
	if err := routedRoom(ctx, restarted, ranks, bootstrap, next()); err != nil {
		t.Fatalf("a room on the restarted B: %v", err)
	}
	stopC()
	<-cDone
	close(cErrs)
	for err := range cErrs {
		t.Errorf("a room on C failed across B's kill and restart: %v", err)
	}
	if cAfter.Load() == 0 {
		t.Fatal("no room on C succeeded after B's kill")
	}
	t.Logf("rooms on C: %d succeeded, %d of them after B's kill, none failed", cOK.Load(), cAfter.Load())
}

// bGone reports a hand-off's error that says its daemon is gone: B
// unreachable (its session could not be opened again), or the room's
// failure as the daemon reported it before it died.
func bGone(err error) bool {
	var rf *client.RoomFailedError
	return errors.Is(err, client.ErrUnavailable) || errors.As(err, &rf)
}

// incarnationOf is d's incarnation (GetStatus).
func incarnationOf(t *testing.T, ctx context.Context, d *fleetDaemon) uint64 {
	t.Helper()
	st, err := d.c.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.GetIncarnation()
}

// restartAt starts d's daemon again on its addresses (its process is
// gone) and waits until it serves past the registry's startup; d's client
// reconnects to it.
func (f *fleet) restartAt(t *testing.T, d *fleetDaemon) *fleetDaemon {
	t.Helper()
	p := e2e.Start(t, "decodeplane "+d.name+" restarted ("+d.addr+")", decodeplaneBinary(t), e2eEnviron(), f.serveArgs(d.addr, d.metrics)...)
	if err := roomsWaitServing(t, p, d.addr); err != nil {
		t.Fatalf("daemon %s did not serve again: %v\noutput:\n%s", d.name, err, p.Out.String())
	}
	r := &fleetDaemon{name: d.name, addr: d.addr, metrics: d.metrics, p: p, c: d.c}
	ctx := fleetCtx(t, 30*time.Second)
	pollUntil(t, 20*time.Second, d.name+" past the registry's startup", func() (bool, string) {
		st, err := r.c.Admin().Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		return st.GetReady() && !strings.Contains(st.GetReadiness(), "registry degraded"), st.GetReadiness()
	})
	return r
}

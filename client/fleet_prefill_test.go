package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The FleetPrefill tests run whole in-process daemons on loopback TCP
// (their advertised addresses are where the FleetPrefill dials them)
// sharing one real embedded etcd. What they wait for arrives on streams
// (SendRoom's end, OpenAndWait's) or is polled with a deadline.

// etcdDaemon is one daemon of an etcd fleet and a client of it.
type etcdDaemon struct {
	*daemontest.Daemon
	addr string
	c    *client.Client
}

// startEtcdFleet starts n daemons sharing etcd, each advertised at its
// loopback address, and waits until every one is in the registry.
func startEtcdFleet(t *testing.T, n int) []*etcdDaemon {
	t.Helper()
	e := etcdtest.Start(t)
	var ds []*etcdDaemon
	for range n {
		addr := e2e.FreeAddr(t)
		d := daemontest.Start(t, daemontest.Options{TCP: true, Config: func(c *config.Config) {
			c.Server.Listen = addr
			c.Timeouts.HeartbeatInterval = 2 * time.Second
			c.Registry.Backend = fleet.BackendEtcd
			c.Registry.Etcd.Endpoints = e.Endpoint()
			c.Registry.Etcd.AdvertiseAddress = addr
			c.Registry.Etcd.Prefix = "/client-test/"
			c.Registry.Etcd.LeaseTTL = 6 * time.Second
			c.Registry.Etcd.RequestTimeout = time.Second
			c.Registry.Etcd.DialTimeout = time.Second
		}})
		c, err := client.New(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		ds = append(ds, &etcdDaemon{Daemon: d, addr: addr, c: c})
	}
	waitUntil(t, "every daemon in the registry", func() bool {
		for _, d := range ds {
			resp, err := d.c.Admin().GetFleet(t.Context())
			if err != nil || len(resp.GetDaemons()) != n || resp.GetRegistry().GetState() != "ok" {
				return false
			}
		}
		return true
	})
	return ds
}

// waitUntil polls cond every 20 ms for at most 20 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runFleetPrefill starts a FleetPrefill of reg seeded with seed and runs
// it until the test ends.
func runFleetPrefill(t *testing.T, seed string, reg *pb.RegisterPrefillRequest, opts ...client.FleetOption) *client.FleetPrefill {
	t.Helper()
	f, err := client.NewFleetPrefill(seed, reg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("FleetPrefill.Run = %v, want context.Canceled", err)
		}
		f.Close()
	})
	return f
}

// sessionsWith waits until f holds a session with every daemon of ds.
func sessionsWith(t *testing.T, f *client.FleetPrefill, ds []*etcdDaemon) {
	t.Helper()
	waitUntil(t, "the rank's sessions with every daemon", func() bool {
		up := map[string]bool{}
		for _, s := range f.Daemons() {
			up[s.Address] = s.Session
		}
		for _, d := range ds {
			if !up[d.addr] {
				return false
			}
		}
		return true
	})
}

// TestFleetPrefillRoutesRooms: a prefill instance of two ranks, each a
// FleetPrefill registered through daemon A only, hands off rooms the
// decode engines open on B and C without being told where they are: each
// room succeeds on its daemon, its destination names that daemon's
// incarnation, and Owner names the daemon. The instance was registered
// through A, once per rank.
func TestFleetPrefillRoutesRooms(t *testing.T) {
	ds := startEtcdFleet(t, 3)
	a, b, c := ds[0], ds[1], ds[2]
	const bootstrap = "10.0.3.1:8998"
	var ranks []*client.FleetPrefill
	for tp := range uint32(2) {
		f := runFleetPrefill(t, a.addr, prefillRank(bootstrap, 2, tp))
		sessionsWith(t, f, ds)
		ranks = append(ranks, f)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 10 {
		d := []*etcdDaemon{b, c}[i%2]
		room := uint64(100 + i)
		wg.Go(func() {
			r, err := d.c.Engine().OpenAndWait(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: bootstrap, Room: room, PromptLen: 300, MaxNewTokens: 8})
			if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
				errs <- fmt.Errorf("room %d on %s: %v %v", room, d.addr, r.GetPhase(), err)
				return
			}
			if _, err := d.c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
				errs <- err
			}
		})
		for _, f := range ranks {
			wg.Go(func() {
				dst, err := f.SendRoom(ctx, room, client.SendOptions{ChunkPages: 2})
				if err != nil {
					errs <- fmt.Errorf("SendRoom %d: %w", room, err)
					return
				}
				if dst.GetIncarnation() != d.Incarnation() {
					errs <- fmt.Errorf("room %d's destination names incarnation %x; its daemon %s is %x", room, dst.GetIncarnation(), d.addr, d.Incarnation())
				}
				if owner, ok := f.Owner(room); !ok || owner != d.addr {
					errs <- fmt.Errorf("Owner(%d) = %q, %v; want %s", room, owner, ok, d.addr)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	resp, err := b.c.Admin().GetFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.GetPrefills() {
		if p.GetBootstrapAddr() == bootstrap && (p.GetRegisteredVia() != a.addr || p.GetRegisteredRanks() != 2) {
			t.Errorf("the instance in the registry: %v, want its 2 ranks registered via A (%s)", p, a.addr)
		}
	}
	for _, f := range ranks {
		if f.Seed().Registration() == nil {
			t.Error("a rank's seed Prefill has no registration")
		}
	}
}

// TestFleetPrefillOwnerStops: daemon B stops while one of its rooms is in
// a hand-off (the prefill moving it) and another was offered and not
// taken yet: both fail on the prefill side at once (the room's failure, or
// B unreachable), and a room on C is handed off meanwhile.
func TestFleetPrefillOwnerStops(t *testing.T) {
	ds := startEtcdFleet(t, 3)
	a, b, c := ds[0], ds[1], ds[2]
	const bootstrap = "10.0.3.2:8998"
	f := runFleetPrefill(t, a.addr, prefillRank(bootstrap, 1, 0))
	sessionsWith(t, f, ds)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	open := func(d *etcdDaemon, room uint64) {
		if _, err := d.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint(room), BootstrapAddr: bootstrap, Room: room, PromptLen: 300, MaxNewTokens: 8}); err != nil {
			t.Fatal(err)
		}
	}
	open(b, 1)
	open(b, 2)
	blocked, release := make(chan struct{}), make(chan struct{})
	handOff := make(chan error, 1)
	go func() {
		_, err := f.ReportRoom(ctx, 1, client.SendOptions{ChunkPages: 1, Move: func(mctx context.Context, ch client.Chunk) (uint64, error) {
			if ch.Index == 1 {
				close(blocked)
				select {
				case <-release: // the chunk moved; its report goes to the stopped daemon
				case <-mctx.Done():
					return 0, mctx.Err()
				}
			}
			return ch.Bytes(), nil
		}})
		handOff <- err
	}()
	<-blocked
	waitUntil(t, "room 2 offered", func() bool { owner, ok := f.Owner(2); return ok && owner == b.addr })
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	close(release)
	var rf *client.RoomFailedError
	err1 := <-handOff
	if !errors.As(err1, &rf) && !errors.Is(err1, client.ErrUnavailable) {
		t.Fatalf("the hand-off of room 1 on the stopped daemon = %v, want its failure or ErrUnavailable", err1)
	}
	_, err2 := f.SendRoom(ctx, 2, client.SendOptions{})
	if !errors.As(err2, &rf) && !errors.Is(err2, client.ErrUnavailable) {
		t.Fatalf("the hand-off of room 2, offered by the stopped daemon = %v, want its failure or ErrUnavailable", err2)
	}
	d := time.Since(stopped)
	if d > 5*time.Second {
		t.Fatalf("the stopped daemon's rooms failed on the prefill side %v after its stop", d)
	}
	t.Logf("B stopped: room 1 (in a hand-off) %v; room 2 (offered) %v; both within %v", err1, err2, d.Round(time.Millisecond))
	open(c, 3)
	if _, err := f.SendRoom(ctx, 3, client.SendOptions{}); err != nil {
		t.Fatalf("room 3 on C after B stopped: %v", err)
	}
}

// TestFleetPrefillOfferWait: a room no daemon offers fails SendRoom with
// ErrNotFound once FleetOfferWait passed.
func TestFleetPrefillOfferWait(t *testing.T) {
	ds := startEtcdFleet(t, 1)
	f := runFleetPrefill(t, ds[0].addr, prefillRank("10.0.3.3:8998", 1, 0), client.FleetOfferWait(100*time.Millisecond))
	if _, err := f.SendRoom(t.Context(), 77, client.SendOptions{}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("SendRoom of a room never opened = %v, want ErrNotFound", err)
	}
}

// TestFleetPrefillBindRoom: a prefill instance of two DP ranks that does not
// follow follow_bootstrap_room; a room opened on B waits for its DP rank.
// The DP-1 rank's BindRoom reaches every daemon (the rank does not know
// B holds the room): B resolves the room to DP 1 and offers it to that
// rank, whose SendRoom hands it off.
func TestFleetPrefillBindRoom(t *testing.T) {
	ds := startEtcdFleet(t, 2)
	a, b := ds[0], ds[1]
	const bootstrap = "10.0.3.4:8998"
	var ranks []*client.FleetPrefill
	for dp := range uint32(2) {
		reg := prefillRank(bootstrap, 1, 0)
		reg.Parallel.AttnDpSize, reg.Parallel.AttnDpRank = 2, dp
		reg.LoadBalanceMethod = "round_robin"
		reg.RankEndpoint = fmt.Sprintf("10.0.3.4:%d", 17000+dp)
		f := runFleetPrefill(t, a.addr, reg)
		sessionsWith(t, f, ds)
		ranks = append(ranks, f)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := b.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "bind", BootstrapAddr: bootstrap, Room: 40, PromptLen: 300, MaxNewTokens: 8}); err != nil {
		t.Fatal(err)
	}
	if replaced, err := ranks[1].BindRoom(ctx, 40); err != nil || replaced {
		t.Fatalf("BindRoom = %v, %v", replaced, err)
	}
	if _, err := ranks[1].SendRoom(ctx, 40, client.SendOptions{}); err != nil {
		t.Fatalf("SendRoom of the room bound to DP 1: %v", err)
	}
	r, err := b.c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 40})
	if err != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || r.GetPrefillDpRank() != 1 {
		t.Fatalf("room 40 on B: %v (DP rank %d), %v; want SUCCEEDED from DP 1", r.GetPhase(), r.GetPrefillDpRank(), err)
	}
	if owner, ok := ranks[0].Owner(40); ok {
		t.Fatalf("the DP-0 rank was offered room 40 (by %s)", owner)
	}
}

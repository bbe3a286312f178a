package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The fleet e2e tests run three `decodeplane serve` binaries sharing one
// real etcd embedded in the test process (internal/testing/etcdtest, over TCP).
// What a daemon learns arrives through etcd's watch, so the tests wait on
// room streams (WaitRoom) where a room reports it and poll the daemons'
// state (GetStatus, /metrics) or etcd's keys with a deadline where nothing
// streams it.

// Every daemon of a fleet test runs with these: a 6 s lease (above the 5 s
// minimum, twice the 2 s heartbeat interval) and a 1 s etcd request bound
// (at most lease_ttl/3).
const (
	fleetLeaseTTL   = 6 * time.Second
	fleetHeartbeat  = 2 * time.Second
	fleetRequestTTL = time.Second
	// fleetBeatEvery is the prefill's heartbeat cadence: half the daemon's
	// interval, as client.Prefill.RunHeartbeat beats.
	fleetBeatEvery = fleetHeartbeat / 2
)

// fleet is one test's etcd, its key prefix, the test's own etcd client
// (to read what the daemons wrote) and the daemons.
type fleet struct {
	etcd    *etcdtest.Server
	prefix  string
	kv      *clientv3.Client
	daemons []*fleetDaemon
}

// fleetDaemon is one daemon binary of the fleet and a Go client of it.
type fleetDaemon struct {
	name    string // A, B, C
	addr    string // gRPC listen address = registry.etcd.advertise_address
	metrics string // /metrics listen address
	p       *daemonProc
	c       *client.Client
}

// startFleet starts etcd and n daemons (named A, B, C, ...) on it, under
// the prefix /e2e-<test>/, and waits until each serves, is past the
// registry's startup ("registry degraded" gone from its readiness) and
// every daemon's record is in etcd.
func startFleet(t *testing.T, n int) *fleet {
	t.Helper()
	decodeplaneBinary(t) // skipped with -short; build once before the clocks start
	e := etcdtest.Start(t)
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	f := &fleet{etcd: e, prefix: "/e2e-" + name + "/"}
	kv, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kv.Close() })
	f.kv = kv
	for i := range n {
		f.daemons = append(f.daemons, f.start(t, string(rune('A'+i))))
	}
	ctx := fleetCtx(t, 30*time.Second)
	for _, d := range f.daemons {
		pollUntil(t, 20*time.Second, d.name+" past the registry's startup", func() (bool, string) {
			st, err := d.c.Admin().Status(ctx)
			if err != nil {
				return false, err.Error()
			}
			return st.GetReady() && !strings.Contains(st.GetReadiness(), "registry degraded"), st.GetReadiness()
		})
	}
	pollUntil(t, 20*time.Second, fmt.Sprintf("%d daemon records in etcd", n), func() (bool, string) {
		recs := f.daemonRecords(t, ctx)
		return len(recs) == n, fmt.Sprint(recs)
	})
	return f
}

// start starts one daemon on free loopback ports (retrying when a port was
// taken between picking it and the daemon's listen) and waits for health
// SERVING.
func (f *fleet) start(t *testing.T, name string) *fleetDaemon {
	t.Helper()
	for attempt := 1; ; attempt++ {
		addr, maddr := freeAddr(t), freeAddr(t)
		p := e2e.Start(t, "decodeplane "+name+" ("+addr+")", decodeplaneBinary(t), e2eEnviron(), f.serveArgs(addr, maddr)...)
		if err := roomsWaitServing(t, p, addr); err != nil {
			if out := p.Out.String(); attempt < 3 && strings.Contains(out, "address already in use") {
				continue
			}
			t.Fatalf("daemon %s did not serve: %v\noutput:\n%s", name, err, p.Out.String())
		}
		// A short reconnect back-off: the tests kill daemons and stop etcd.
		c, err := client.New(addr, client.WithDialOptions(grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: time.Second})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return &fleetDaemon{name: name, addr: addr, metrics: maddr, p: p, c: c}
	}
}

// serveArgs are the arguments of a daemon of the fleet listening on addr
// (gRPC, advertised) and maddr (/metrics).
func (f *fleet) serveArgs(addr, maddr string) []string {
	return []string{"serve", "--listen", addr,
		"--set", "server.metrics_listen=" + maddr,
		"--set", "registry.backend=etcd",
		"--set", "registry.etcd.endpoints=" + f.etcd.Endpoint(),
		"--set", "registry.etcd.advertise_address=" + addr,
		"--set", "registry.etcd.prefix=" + f.prefix,
		"--set", "registry.etcd.lease_ttl=" + fleetLeaseTTL.String(),
		"--set", "timeouts.heartbeat_interval=" + fleetHeartbeat.String(),
		"--set", "registry.etcd.request_timeout=" + fleetRequestTTL.String(),
	}
}

// fleetCtx bounds a test's calls.
func fleetCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// pollUntil checks cond every 50 ms until it holds, for at most within;
// cond also says what it saw, for the failure message.
func pollUntil(t *testing.T, within time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, saw := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("timed out after %s waiting for %s; last seen: %s", within, what, saw)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ---- etcd, as the daemons wrote it (fleet/records.go's layout) ----

// etcdDaemon is the part of a daemon record the tests read.
type etcdDaemon struct {
	Address     string `json:"address"`
	Incarnation string `json:"incarnation"` // 16 hex digits
	Lease       int64  `json:"lease"`
}

// etcdInstance is the part of a prefill instance record the tests read.
type etcdInstance struct {
	Addr          string `json:"bootstrap_addr"`
	InstanceID    string `json:"instance_id"`
	Lease         int64  `json:"lease"`
	RegisteredVia string `json:"registered_via"`
}

// daemonRecords reads every daemon record under the prefix, by address.
func (f *fleet) daemonRecords(t *testing.T, ctx context.Context) map[string]etcdDaemon {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := f.kv.Get(rctx, f.prefix+"daemons/", clientv3.WithPrefix())
	if err != nil {
		t.Fatalf("read the daemon records from etcd: %v", err)
	}
	out := map[string]etcdDaemon{}
	for _, kv := range resp.Kvs {
		var d etcdDaemon
		if err := json.Unmarshal(kv.Value, &d); err != nil {
			t.Fatalf("daemon record %s does not decode: %v: %s", kv.Key, err, kv.Value)
		}
		if want := f.prefix + "daemons/" + url.PathEscape(d.Address); string(kv.Key) != want {
			t.Fatalf("daemon record of %s is at %s, want %s", d.Address, kv.Key, want)
		}
		out[d.Address] = d
	}
	return out
}

// instanceRecord reads the prefill instance record of bootstrap (false
// when there is none).
func (f *fleet) instanceRecord(t *testing.T, ctx context.Context, bootstrap string) (etcdInstance, bool) {
	t.Helper()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := f.kv.Get(rctx, f.prefix+"prefills/"+url.PathEscape(bootstrap)+"/instance")
	if err != nil {
		t.Fatalf("read the instance record of %s from etcd: %v", bootstrap, err)
	}
	if len(resp.Kvs) == 0 {
		return etcdInstance{}, false
	}
	var rec etcdInstance
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatalf("instance record of %s does not decode: %v: %s", bootstrap, err, resp.Kvs[0].Value)
	}
	return rec, true
}

// ---- /metrics ----

// metric scrapes the daemon's /metrics and returns the sample of an
// unlabelled metric (false when the scrape failed or the metric is absent).
func (d *fleetDaemon) metric(name string) (float64, bool) {
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), name+" ")
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		return f, err == nil
	}
	return 0, false
}

// ---- prefills and rooms ----

// fleetRank is a one-rank prefill instance (TP 1, the daemon's page size
// and dtype) at bootstrap with the given instance id.
func fleetRank(bootstrap, instance string) *pb.RegisterPrefillRequest {
	host, _, _ := strings.Cut(bootstrap, ":")
	return &pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: host + ":17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: instance}
}

// fleetOpen opens a room of bootstrap's instance on d (the decode engine's
// OpenRoom) and returns its phase then.
func fleetOpen(t *testing.T, ctx context.Context, d *fleetDaemon, bootstrap string, room uint64) pb.RoomPhase {
	t.Helper()
	resp, err := d.c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprintf("rid-%d", room), BootstrapAddr: bootstrap, Room: room, PromptLen: 256, MaxNewTokens: 16})
	if err != nil {
		t.Fatalf("OpenRoom %d on %s: %v", room, d.name, err)
	}
	return resp.GetRoom().GetPhase()
}

// awaitAdmitted waits (on the room's stream) until room on d is admitted:
// d knows the prefill instance by then (it arrived through etcd when it
// registered through another daemon) and a claim is accepted.
func awaitAdmitted(t *testing.T, ctx context.Context, d *fleetDaemon, room uint64) {
	t.Helper()
	if r, err := d.c.Engine().WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_ADMITTED); err != nil {
		t.Fatalf("room %d on %s never admitted: %v (%v)", room, d.name, err, r.GetFailure())
	}
}

// deliver has the prefill p (a Prefill of d's client) deliver an admitted
// room with SendRoom, checks it succeeded on d and releases it.
func deliver(ctx context.Context, d *fleetDaemon, p *client.Prefill, room uint64) error {
	if _, err := p.SendRoom(ctx, room, client.SendOptions{ChunkPages: 2, OutputIDs: []int32{7}}); err != nil {
		return fmt.Errorf("SendRoom %d through %s: %w", room, d.name, err)
	}
	r, err := d.c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: room})
	if err != nil {
		return fmt.Errorf("GetRoom %d on %s: %w", room, d.name, err)
	}
	if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		return fmt.Errorf("room %d on %s after SendRoom: %s (%v), want SUCCEEDED", room, d.name, r.GetPhase(), r.GetFailure())
	}
	rel, err := d.c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
	if err != nil {
		return fmt.Errorf("ReleaseRoom %d on %s: %w", room, d.name, err)
	}
	if rel.GetPagesReleased() != r.GetNumPages() || r.GetNumPages() == 0 {
		return fmt.Errorf("ReleaseRoom %d on %s released %d pages of %d", room, d.name, rel.GetPagesReleased(), r.GetNumPages())
	}
	return nil
}

// roomOnce opens a room on d, waits for its admission and delivers it.
func roomOnce(t *testing.T, ctx context.Context, d *fleetDaemon, p *client.Prefill, bootstrap string, room uint64) {
	t.Helper()
	fleetOpen(t, ctx, d, bootstrap, room)
	awaitAdmitted(t, ctx, d, room)
	if err := deliver(ctx, d, p, room); err != nil {
		t.Fatal(err)
	}
}

// knownBy waits until d's GetStatus lists bootstrap's instance with all
// its ranks (it reached d through etcd's watch).
func knownBy(t *testing.T, ctx context.Context, d *fleetDaemon, bootstrap string) {
	t.Helper()
	pollUntil(t, 20*time.Second, d.name+" to know "+bootstrap, func() (bool, string) {
		st, err := d.c.Admin().Status(ctx)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range st.GetPrefills() {
			if p.GetBootstrapAddr() == bootstrap {
				return p.GetRegisteredRanks() > 0 && p.GetRegisteredRanks() == p.GetExpectedRanks(), fmt.Sprint(p)
			}
		}
		return false, fmt.Sprint(st.GetPrefills())
	})
}

// failedRooms lists d's failed rooms.
func failedRooms(t *testing.T, ctx context.Context, d *fleetDaemon) []*pb.Room {
	t.Helper()
	resp, err := d.c.Admin().ListRooms(ctx, &pb.ListRoomsRequest{Phases: []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_FAILED}})
	if err != nil {
		t.Fatalf("ListRooms on %s: %v", d.name, err)
	}
	return resp.GetRooms()
}

// ---- heartbeats ----

// beater heartbeats one prefill rank through a list of daemons, one at a
// time (the first first), every fleetBeatEvery, and moves to the next when
// a beat fails for its daemon (Unavailable or a deadline): the prefill
// side of a fleet whose daemon died. Each beat is bounded by the
// heartbeat interval, as client.Prefill bounds its own.
type beater struct {
	mu     sync.Mutex
	ok     map[string]int // successful beats by daemon name
	failed map[string][]error
	cur    string
	moved  chan string // the daemon it moved to, at its first successful beat there
	stop   context.CancelFunc
	done   chan struct{}
}

// startBeater heartbeats the rank of reg (registered already) through ds.
func startBeater(t *testing.T, reg *pb.RegisterPrefillRequest, ds ...*fleetDaemon) *beater {
	ranks := make([]*client.Prefill, len(ds)) // the rank's view on each daemon
	for i, d := range ds {
		ranks[i] = d.c.Prefill(reg)
	}
	ctx, cancel := context.WithCancel(t.Context())
	b := &beater{ok: map[string]int{}, failed: map[string][]error{}, moved: make(chan string, len(ds)), stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		tk := time.NewTicker(fleetBeatEvery)
		defer tk.Stop()
		i := 0
		for {
			d, p := ds[i], ranks[i]
			bctx, bcancel := context.WithTimeout(ctx, fleetHeartbeat)
			_, err := p.Heartbeat(bctx)
			bcancel()
			if ctx.Err() != nil {
				return
			}
			b.mu.Lock()
			if err == nil {
				b.ok[d.name]++
				if b.ok[d.name] == 1 {
					b.moved <- d.name
				}
				b.cur = d.name
			} else {
				b.failed[d.name] = append(b.failed[d.name], err)
			}
			b.mu.Unlock()
			if err != nil && (errors.Is(err, client.ErrUnavailable) || errors.Is(err, client.ErrDeadlineExceeded)) && i+1 < len(ds) {
				i++
				continue // the next daemon at once: the lease must not wait a cadence more
			}
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
		}
	}()
	t.Cleanup(b.halt)
	return b
}

// halt stops the beats and waits for the loop.
func (b *beater) halt() {
	b.stop()
	<-b.done
}

// counts returns the successful beats and the failures by daemon.
func (b *beater) counts() (map[string]int, map[string][]error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ok, failed := map[string]int{}, map[string][]error{}
	for k, v := range b.ok {
		ok[k] = v
	}
	for k, v := range b.failed {
		failed[k] = append([]error(nil), v...)
	}
	return ok, failed
}

// movedTo waits until the beats succeed through daemon name.
func (b *beater) movedTo(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	for {
		select {
		case got := <-b.moved:
			if got == name {
				return
			}
		case <-ctx.Done():
			ok, failed := b.counts()
			t.Fatalf("the heartbeats never reached %s: ok %v, failed %v", name, ok, failed)
		}
	}
}

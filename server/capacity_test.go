package server_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// capWatch collects a WatchCapacity stream's updates with the (bubble)
// time each arrived.
type capWatch struct {
	mu   sync.Mutex
	got  []*pb.CapacityUpdate
	when []time.Time
	done chan error
}

func watchCapacity(t *testing.T, ctx context.Context, conn *grpc.ClientConn, req *pb.WatchCapacityRequest) *capWatch {
	t.Helper()
	st, err := pb.NewCapacityClient(conn).WatchCapacity(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	w := &capWatch{done: make(chan error, 1)}
	go func() {
		for {
			u, err := st.Recv()
			if err != nil {
				w.done <- err
				return
			}
			w.mu.Lock()
			w.got, w.when = append(w.got, u), append(w.when, time.Now())
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *capWatch) n() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.got)
}

func (w *capWatch) last() (*pb.CapacityUpdate, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.got[len(w.got)-1], w.when[len(w.when)-1]
}

func (w *capWatch) all() ([]*pb.CapacityUpdate, []time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]*pb.CapacityUpdate(nil), w.got...), append([]time.Time(nil), w.when...)
}

// shardStatus is GetStatus's shard 0.
func shardStatus(t *testing.T, ctx context.Context, conn *grpc.ClientConn) *pb.ShardStatus {
	t.Helper()
	st, err := pb.NewAdminClient(conn).GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st.GetShards()[0]
}

// scrape reads the daemon's /metrics.
func scrape(d *daemontest.Daemon) string {
	rec := httptest.NewRecorder()
	d.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	return rec.Body.String()
}

// TestWatchCapacityFeed runs a whole daemon (bufconn) in a synctest bubble
// with min_interval 1s and keepalive 10s on a 512-page shard (16 tokens a
// page, R = 512): the first update at once with the ledger's figures;
// nothing without a change; an admission changes tokens_free in the next
// poll; a keepalive 10s after the last update; a burst of changes yields
// one update per second; draining pages show; shutdown ends the stream
// with ready=false.
func TestWatchCapacityFeed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dec := stgDecodeConfig(1)
		r := int64(dec.Admission.ReservedDecodeTokens)
		d, err := daemontest.New(daemontest.Options{Config: func(c *config.Config) {
			c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
			c.Timeouts.HeartbeatInterval = time.Hour
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		conn := d.Conn(t)
		stopped := false
		defer func() { // a failed check leaves no goroutine in the bubble
			if !stopped {
				cancel()
				conn.Close()
				d.Stop()
			}
		}()
		w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
			s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
		w.register("first")
		const minI, keep = time.Second, 10 * time.Second
		start := time.Now()
		cw := watchCapacity(t, ctx, conn, &pb.WatchCapacityRequest{MinInterval: durationpb.New(minI), KeepaliveInterval: durationpb.New(keep)})
		synctest.Wait()

		// 1. The first update at once, with the ledger's figures.
		if cw.n() != 1 {
			t.Fatalf("%d updates at the start, want 1", cw.n())
		}
		u, at := cw.last()
		sh := shardStatus(t, ctx, conn)
		want := &pb.ShardCapacity{DpRank: 0, PageSize: 16, TokensTotal: 512 * 16, TokensFree: 512 * 16, PagesTotal: 512, PagesFree: 512,
			ReqSlotsTotal: sh.GetReqSlotsTotal(), ReqSlotsFree: sh.GetReqSlotsTotal(), BlockedBy: "none", ReservedDecodeTokens: 512}
		if !at.Equal(start) || u.GetSequence() != 1 || !u.GetReady() || u.GetReadiness() != "serving" || u.GetDraining() ||
			u.GetIncarnation() != d.Incarnation() || u.GetAddress() != d.Server().Address() || !u.GetAt().AsTime().Equal(start) ||
			len(u.GetShards()) != 1 || !proto.Equal(u.GetShards()[0], want) {
			t.Fatalf("first update (after %s): %v\nwant sequence 1, ready serving, incarnation %x, shard %v", at.Sub(start), u, d.Incarnation(), want)
		}
		if sh.GetPagesTotal() != 512 || sh.GetPagesFree() != 512 || sh.GetReqSlotsFree() != sh.GetReqSlotsTotal() {
			t.Fatalf("GetStatus shard %v, want an empty 512-page ledger", sh)
		}

		// 2. No change, no update before the keepalive.
		time.Sleep(4500 * time.Millisecond)
		synctest.Wait()
		if cw.n() != 1 {
			t.Fatalf("%d updates after 4.5s without a change, want 1", cw.n())
		}

		// 3. Room 7 (6000 tokens: 375 pages) is admitted at 4.5s; the poll
		// at 5s sends the new figures.
		w.open(7)
		synctest.Wait()
		if cw.n() != 1 {
			t.Fatalf("an update before min_interval passed: %d", cw.n())
		}
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if cw.n() != 2 {
			t.Fatalf("%d updates after the admission, want 2", cw.n())
		}
		u, at = cw.last()
		sh = shardStatus(t, ctx, conn)
		free := int64(sh.GetPagesFree())*16 - r // the free pages less R for the admitted room
		if sh.GetPagesFree() != 512-375 || free != 1680 {
			t.Fatalf("GetStatus pages_free %d, want 137", sh.GetPagesFree())
		}
		want.TokensFree, want.PagesFree, want.ReqSlotsFree = uint64(free), uint64(free/16), sh.GetReqSlotsFree()
		if at.Sub(start) != 5*time.Second || u.GetSequence() != 2 || !proto.Equal(u.GetShards()[0], want) {
			t.Fatalf("update after the admission (at %s): %v\nwant at 5s, sequence 2, shard %v", at.Sub(start), u, want)
		}
		// /metrics: the same figures, read at scrape time.
		m := scrape(d)
		for _, line := range []string{`decodeplane_shard_tokens_free{dp_rank="0"} 1680`, `decodeplane_shard_tokens_total{dp_rank="0"} 8192`} {
			if !strings.Contains(m, line+"\n") {
				t.Errorf("/metrics lacks %q", line)
			}
		}

		// 4. The keepalive: 10s after the last update, nothing changed.
		time.Sleep(keep - time.Millisecond)
		synctest.Wait()
		if cw.n() != 2 {
			t.Fatalf("an update before the keepalive: %d", cw.n())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if cw.n() != 3 {
			t.Fatalf("%d updates at the keepalive, want 3", cw.n())
		}
		u, at = cw.last()
		if at.Sub(start) != 15*time.Second || u.GetSequence() != 3 || !proto.Equal(u.GetShards()[0], want) {
			t.Fatalf("keepalive update (at %s): %v, want at 15s, sequence 3, the same figures", at.Sub(start), u)
		}

		// 5. A burst: a room queues every 100ms for 2.5s (each changes
		// queue_depth): at most one update per second.
		burst := time.Now()
		for i := range 25 {
			w.open(100 + uint64(i))
			time.Sleep(100 * time.Millisecond)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got, when := cw.all()
		for i := 1; i < len(when); i++ {
			if gap := when[i].Sub(when[i-1]); gap < minI {
				t.Errorf("updates %d and %d are %s apart, below min_interval %s", i, i+1, gap, minI)
			}
		}
		var inBurst int
		depth := uint32(0)
		for i, at := range when {
			if at.After(burst) {
				inBurst++
				if d := got[i].GetShards()[0].GetQueueDepth(); d < depth {
					t.Errorf("queue_depth went down from %d to %d", depth, d)
				} else {
					depth = d
				}
			}
		}
		u, _ = cw.last()
		if inBurst != 3 || u.GetShards()[0].GetQueueDepth() != 25 || u.GetShards()[0].GetBlockedBy() != "tokens" {
			t.Fatalf("%d updates in the 3.5s of the burst (want 3: one per second); last %v, want queue_depth 25 blocked by tokens", inBurst, u)
		}

		// 6. Room 7 ends while its prefill writes by itself: its 375 pages
		// drain (not free, and no reservation for it any more).
		next, dst := w.claimAndWrite(7)
		if _, err := w.s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
			t.Fatal(err)
		}
		if ev, err := next(); err != nil || !ev.GetAckRequired() {
			t.Fatalf("claim's end = %v, %v", ev, err)
		}
		time.Sleep(minI)
		synctest.Wait()
		u, _ = cw.last()
		sc := u.GetShards()[0]
		if sc.GetDrainingPages() != uint64(len(dst.GetPageIndices())) || sc.GetDrainingPages() != 375 || sc.GetTokensFree() != 137*16 ||
			shardStatus(t, ctx, conn).GetDrainingPages() != 375 {
			t.Fatalf("after the abort: %v, want 375 draining pages and tokens_free %d", sc, 137*16)
		}

		// 7. Shutdown: a last update with ready=false, then the stream ends OK.
		n := cw.n()
		stopped = true
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
		if err := <-cw.done; !errors.Is(err, io.EOF) {
			t.Fatalf("the stream ended with %v, want io.EOF (OK)", err)
		}
		u, _ = cw.last()
		if cw.n() <= n || u.GetReady() || u.GetReadiness() != server.ReadinessShuttingDown || !u.GetDraining() {
			t.Fatalf("last update %v (of %d, %d before the stop), want ready=false, %q", u, cw.n(), n, server.ReadinessShuttingDown)
		}
		conn.Close()
	})
}

// TestWatchCapacityEndsOnCancel: the handler returns when the client
// cancels (its call is counted as handled), and sends nothing more.
func TestWatchCapacityEndsOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d, err := daemontest.New(daemontest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		conn := d.Conn(t)
		handled := func() int {
			n := 0
			for line := range strings.Lines(scrape(d)) {
				if strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_method="WatchCapacity"`) && !strings.HasSuffix(line, " 0\n") {
					n++
				}
			}
			return n
		}
		ctx, cancel := context.WithCancel(context.Background())
		cw := watchCapacity(t, ctx, conn, &pb.WatchCapacityRequest{MinInterval: durationpb.New(10 * time.Millisecond), KeepaliveInterval: durationpb.New(time.Second)})
		time.Sleep(3500 * time.Millisecond) // the first update and three keepalives
		synctest.Wait()
		if cw.n() != 4 || handled() != 0 {
			t.Fatalf("%d updates, %d handled calls before the cancel; want 4, 0", cw.n(), handled())
		}
		cancel()
		synctest.Wait()
		if err := <-cw.done; err == nil {
			t.Fatal("the stream did not end")
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if cw.n() != 4 || handled() != 1 {
			t.Fatalf("after the cancel: %d updates, %d handled calls; want 4, 1 (the handler returned)", cw.n(), handled())
		}
		conn.Close()
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// TestWatchCapacityOverTheGateway: GET /v1/capacity streams the updates as
// JSON lines, and needs the token like the gRPC call.
func TestWatchCapacityOverTheGateway(t *testing.T) {
	url := newGatewayServer(t, "gw-token")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	code, body, _ := gwCall(t, ctx, "GET", url+"/v1/capacity", "", "")
	if code != http.StatusUnauthorized || !strings.Contains(body, `"code":16`) {
		t.Fatalf("GET /v1/capacity without a token = %d %s, want 401", code, body)
	}
	req, err := http.NewRequestWithContext(ctx, "GET", url+"/v1/capacity?min_interval=0.5s", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer gw-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(line, `{"result":`) || !strings.Contains(line, `"ready":true`) ||
		!strings.Contains(line, `"sequence":"1"`) || !strings.Contains(line, `"tokens_total":"`) {
		t.Fatalf("GET /v1/capacity = %d, first line %q, %v", resp.StatusCode, line, err)
	}
	code, body, _ = gwCall(t, ctx, "GET", url+"/v1/capacity?min_interval=1ms", "Bearer gw-token", "")
	if code != http.StatusBadRequest || !strings.Contains(body, "min_interval: 1ms is out of range") {
		t.Fatalf("GET /v1/capacity?min_interval=1ms = %d %s, want 400 naming min_interval", code, body)
	}
}

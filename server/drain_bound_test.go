package server_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// lockedLog collects the daemon's log lines.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestDeferredReleaseBoundAtTheWire runs a whole daemon (bufconn) in a
// synctest bubble: a rank that never acks holds room 7's pages for exactly
// release.deferred_timeout; then they go back with a warning naming the rank
// and decodeplane_room_end_acks_total{outcome="expired"}, and the queued
// room 8 is admitted.
func TestDeferredReleaseBoundAtTheWire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs lockedLog
		dec := stgDecodeConfig(1)
		d, err := daemontest.New(daemontest.Options{
			Config: func(c *config.Config) {
				c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
				c.Timeouts.HeartbeatInterval = time.Hour
				c.Release.DeferredTimeout = 20 * time.Second
			},
			Daemon: daemon.Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		conn := d.Conn(t)
		w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
			s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
		w.register("first")
		w.open(7)
		next, _ := w.claimAndWrite(7)
		if _, err := w.s.room.AbortRoom(ctx, &pb.AbortRoomRequest{Room: 7}); err != nil {
			t.Fatal(err)
		}
		if ev, err := next(); err != nil || !ev.GetAckRequired() {
			t.Fatalf("claim's end = %v, %v", ev, err)
		}
		w.open(8)
		time.Sleep(20*time.Second - time.Millisecond) // the bubble's clock
		synctest.Wait()
		if ph := w.phase(8); ph != pb.RoomPhase_ROOM_PHASE_QUEUED || w.draining() != 1 || ackCount(t, d, "expired") != 0 {
			t.Fatalf("just before the bound: room 8 %v, %d draining; want QUEUED, 1", ph, w.draining())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if ph := w.phase(8); ph != pb.RoomPhase_ROOM_PHASE_ADMITTED || w.draining() != 0 {
			t.Fatalf("at the bound: room 8 %v, %d draining; want ADMITTED, 0", ph, w.draining())
		}
		if ackCount(t, d, "expired") != 1 || ackCount(t, d, "acked") != 0 {
			t.Fatalf("acks: expired %v, acked %v; want 1, 0", ackCount(t, d, "expired"), ackCount(t, d, "acked"))
		}
		if l := logs.String(); !strings.Contains(l, "release.deferred_timeout expired") || !strings.Contains(l, `ranks="[cp 0 tp 0 pp 0]"`) || !strings.Contains(l, "room=7") {
			t.Fatalf("no warning naming room 7's rank:\n%s", l)
		}
		cancel()
		conn.Close()
		if err := d.Stop(); err != nil {
			t.Fatal(err)
		}
	})
}

package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/e2e"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestE2EKill9NewIncarnation: the daemon binary is killed (SIGKILL) while a
// prefill (the Go client) is mid-hand-off, and started again on the same
// port. The restarted daemon has another incarnation; the prefill's
// heartbeat learns it and registers again; the hand-off stops with
// ErrIncarnationChanged before its next write, and the new daemon never
// hears of the old room.
func TestE2EKill9NewIncarnation(t *testing.T) {
	addr := freeAddr(t)
	args := []string{"serve", "--listen", addr, "--set", "server.metrics_listen="}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	hc, first, c := startForRestart(t, addr, args)
	st, err := c.Admin().Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oldInc := st.GetIncarnation()
	if oldInc == 0 || !strings.Contains(first.Out.String(), fmt.Sprintf("%x", oldInc)) {
		t.Fatalf("incarnation %x: want non-zero and logged at startup:\n%s", oldInc, first.Out.String())
	}

	const bootstrap = "10.1.0.1:8998"
	changes := make(chan [2]uint64, 4)
	beatErrs := make(chan error, 64)
	p := c.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: bootstrap, RankEndpoint: "10.1.0.1:17000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16", InstanceId: "prefill-e2e"},
		client.HeartbeatEvery(50*time.Millisecond),
		client.OnIncarnationChange(func(o, n uint64) { changes <- [2]uint64{o, n} }),
		client.OnHeartbeatError(func(err error) {
			select {
			case beatErrs <- err:
			default:
			}
		}))
	if _, err := p.Register(ctx); err != nil {
		t.Fatal(err)
	}
	hctx, stopBeat := context.WithCancel(ctx)
	beat := make(chan error, 1)
	go func() { beat <- p.RunHeartbeat(hctx) }()
	defer func() {
		stopBeat()
		<-beat
	}()

	if _, err := c.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "r-5", BootstrapAddr: bootstrap, Room: 5, PromptLen: 1000, MaxNewTokens: 64}); err != nil {
		t.Fatal(err)
	}
	// The prefill moves the KV itself (ReportRoom); its Move of chunk 1 of
	// 4 is in progress when the daemon dies.
	blocked, release := make(chan struct{}), make(chan struct{})
	var moved []int
	done := make(chan error, 1)
	go func() {
		_, err := p.ReportRoom(ctx, 5, client.SendOptions{ChunkPages: 4, Move: func(_ context.Context, ch client.Chunk) (uint64, error) {
			moved = append(moved, ch.Index)
			if ch.Index == 1 {
				close(blocked)
				<-release
			}
			return ch.Bytes(), nil
		}})
		done <- err
	}()
	select {
	case <-blocked:
	case err := <-done:
		t.Fatalf("ReportRoom ended before chunk 1: %v", err)
	}

	killed := time.Now()
	first.Kill(t, 10*time.Second)
	second := startDaemon(t, args, e2eEnviron())
	e2e.WaitHealth(t, hc, second, healthpb.HealthCheckResponse_SERVING, 30*time.Second)
	var change [2]uint64
	select {
	case change = <-changes:
	case <-ctx.Done():
		t.Fatalf("the prefill never saw the new incarnation; heartbeat errors: %d", len(beatErrs))
	}
	learned := time.Since(killed)
	close(release)
	err = <-done

	st, err2 := c.Admin().Status(ctx)
	if err2 != nil {
		t.Fatal(err2)
	}
	newInc := st.GetIncarnation()
	if newInc == 0 || newInc == oldInc {
		t.Fatalf("the restarted daemon's incarnation is %x, the killed one's %x: want a new non-zero one", newInc, oldInc)
	}
	if change != [2]uint64{oldInc, newInc} {
		t.Errorf("the prefill saw %x -> %x; want %x -> %x", change[0], change[1], oldInc, newInc)
	}
	var ic *client.IncarnationChangedError
	if !errors.Is(err, client.ErrIncarnationChanged) || !errors.As(err, &ic) || ic.Old != oldInc || ic.New != newInc || ic.Room != 5 {
		t.Fatalf("ReportRoom across the restart = %v; want IncarnationChangedError{5, %x, %x}", err, oldInc, newInc)
	}
	if len(moved) != 2 {
		t.Errorf("chunks moved: %v; want 0 and 1 only", moved)
	}
	// The heartbeat registered the rank again with the new daemon, which
	// never heard of room 5.
	if p.Incarnation() != newInc || p.Registration().GetIncarnation() != newInc {
		t.Errorf("prefill holds incarnation %x, registration %x; want %x", p.Incarnation(), p.Registration().GetIncarnation(), newInc)
	}
	if len(st.GetPrefills()) != 1 || st.GetPrefills()[0].GetBootstrapAddr() != bootstrap || st.GetPrefills()[0].GetRegisteredRanks() != 1 {
		t.Errorf("prefills at the new daemon = %v; want %s re-registered", st.GetPrefills(), bootstrap)
	}
	var rooms uint32
	for _, n := range st.GetRoomsByPhase() {
		rooms += n
	}
	if rooms != 0 {
		t.Errorf("the new daemon holds rooms %v; want none (nothing of the old destination reached it)", st.GetRoomsByPhase())
	}
	if _, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 5}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("GetRoom(5) at the new daemon = %v; want ErrNotFound", err)
	}
	if !strings.Contains(second.Out.String(), fmt.Sprintf("%x", newInc)) {
		t.Errorf("the new incarnation %x is not in the startup log:\n%s", newInc, second.Out.String())
	}
	t.Logf("kill -9 to the prefill learning incarnation %x -> %x: %v", oldInc, newInc, learned.Round(time.Millisecond))
}

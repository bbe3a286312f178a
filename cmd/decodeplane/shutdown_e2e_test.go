package main

// End-to-end tests of the shutdown: SIGTERM to the real binary
// with rooms in every phase and streams open on them. Every claim stream
// (AwaitDestination) gets its room's FAILURE_CODE_SHUTDOWN event and every
// WatchRoom stream its room's terminal event before the server stops, each
// stream then ends OK, and the exit status says whether the graceful stop
// was cut short (3) or clean (0).

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/daemon"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// shutdownStartDaemon is roomsStartDaemon that also returns the process, to
// signal it.
func shutdownStartDaemon(t *testing.T, cfgYAML string) (*roomsDaemon, *daemonProc) {
	t.Helper()
	cfgPath := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		addr := freeAddr(t)
		p := startDaemon(t, []string{"serve", "--config", cfgPath, "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron())
		err := roomsWaitServing(t, p, addr)
		if err == nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("daemon %s output:\n%s", addr, p.Out.String())
				}
			})
			d := &roomsDaemon{addr: addr}
			d.c = d.newClient(t, "")
			return d, p
		}
		if attempt < 3 && strings.Contains(p.Out.String(), "address already in use") {
			continue
		}
		t.Fatalf("the daemon did not serve: %v\noutput:\n%s", err, p.Out.String())
	}
}

// rawConn is a plain gRPC connection to the daemon (no client library, no
// retries): what a stream sees is what the daemon sent.
func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// recorded is what one server stream delivered, and how it ended.
type recorded[T any] struct {
	name   string
	events []T
	err    error         // the Recv error that ended it: io.EOF is OK
	first  chan struct{} // closed at the first event
	done   chan struct{} // closed when the stream ended; events and err are then final
}

// record reads a stream in the background until it ends.
func record[T any](name string, recv func() (T, error)) *recorded[T] {
	r := &recorded[T]{name: name, first: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			ev, err := recv()
			if err != nil {
				r.err = err
				return
			}
			r.events = append(r.events, ev)
			if len(r.events) == 1 {
				close(r.first)
			}
		}
	}()
	return r
}

// ended waits for the stream's end and checks it ended OK.
func (r *recorded[T]) ended(t *testing.T, within time.Duration) bool {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(within):
		t.Errorf("%s: the stream did not end within %s", r.name, within)
		return false
	}
	if r.err != io.EOF {
		t.Errorf("%s: the stream ended with %v (code %s) after %d events, want OK", r.name, r.err, status.Code(r.err), len(r.events))
		return false
	}
	return true
}

// claimStream opens rank's AwaitDestination on room over conn; with dest it
// first takes the destination (the room is admitted).
func claimStream(t *testing.T, ctx context.Context, conn *grpc.ClientConn, rank *roomsRank, room uint64, dest bool) (*recorded[*pb.DestinationEvent], *pb.Destination) {
	t.Helper()
	s, err := pb.NewRoomsClient(conn).AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: rank.Rank()})
	if err != nil {
		t.Fatalf("AwaitDestination %d: %v", room, err)
	}
	var d *pb.Destination
	if dest {
		ev, err := s.Recv()
		if err != nil || ev.GetDestination() == nil {
			t.Fatalf("AwaitDestination %d: got %v, %v; want the destination", room, ev, err)
		}
		d = ev.GetDestination()
	}
	name := fmt.Sprintf("claim of room %d by tp %d", room, rank.Rank().GetTpRank())
	return record(name, s.Recv), d
}

// watchStream opens WatchRoom on room over conn.
func watchStream(t *testing.T, ctx context.Context, conn *grpc.ClientConn, room uint64) *recorded[*pb.RoomEvent] {
	t.Helper()
	s, err := pb.NewRoomsClient(conn).WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
	if err != nil {
		t.Fatalf("WatchRoom %d: %v", room, err)
	}
	return record(fmt.Sprintf("watch of room %d", room), s.Recv)
}

// healthStream watches the daemon's health; notServing is closed when it
// reports NOT_SERVING (the drain began).
func healthStream(t *testing.T, ctx context.Context, conn *grpc.ClientConn) (*recorded[*healthpb.HealthCheckResponse], chan struct{}) {
	t.Helper()
	s, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := s.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v; want SERVING", resp, err)
	}
	notServing := make(chan struct{})
	closed := false
	return record("health watch", func() (*healthpb.HealthCheckResponse, error) {
		resp, err := s.Recv()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING && !closed {
			closed = true
			close(notServing)
		}
		return resp, err
	}), notServing
}

const shutdownAbortWording = "aborted: decode server shutting down"

// TestE2EShutdownTellsEveryStream: SIGTERM with a 2 s shutdown_timeout and
// rooms that cannot finish: queued, waiting for a prefill that never
// registers, admitted (one of two ranks claimed), claimed, transferring,
// succeeded (not released), and a claim on a room never opened. Every claim
// stream gets a DestinationEvent{failure: SHUTDOWN}, every WatchRoom stream
// its room's terminal event (FAILED with SHUTDOWN; RELEASED for the
// succeeded room), every stream then ends OK (not UNAVAILABLE), the health
// watch ends OK after NOT_SERVING, and the process exits 3.
func TestE2EShutdownTellsEveryStream(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 2 * time.Second
	// Four request slots: rooms 9001–9004 are admitted, 9005 queues.
	d, p := shutdownStartDaemon(t, fmt.Sprintf("server:\n  shutdown_timeout: %s\nkv_pool:\n  kind: gqa\n  request_slots: 4\n  pre_alloc_slots: 0\n", shutdownTimeout))
	ctx := roomsCtx(t)
	const (
		addr   = "10.0.9.1:8998" // prefill TP 2
		absent = "10.0.9.2:8998" // never registers
	)
	ranks := d.startRanks(t, roomsInstance(addr, 2, 1, "", roomsGQAModel)...)
	conn := rawConn(t, d.addr)
	var claims []*recorded[*pb.DestinationEvent]
	watches := map[uint64]*recorded[*pb.RoomEvent]{}

	// A claim on a room never opened, first: the stream reaches the daemon
	// long before the signal.
	pending, _ := claimStream(t, ctx, conn, ranks[0], 9099, false)

	open := func(room uint64, bootstrap string) {
		t.Helper()
		if _, err := d.c.OpenRoom(ctx, roomsOpen(bootstrap, room, 1000)); err != nil {
			t.Fatalf("OpenRoom %d: %v", room, err)
		}
	}
	wantPhase := func(room uint64, phase pb.RoomPhase) {
		t.Helper()
		if _, err := d.c.WaitRoom(ctx, room, phase); err != nil {
			t.Fatalf("room %d never reached %s: %v", room, phase, err)
		}
		if got := d.getRoom(t, ctx, room).GetPhase(); got != phase {
			t.Fatalf("room %d is %s, want %s", room, got, phase)
		}
	}

	// 9001 admitted: rank 0 holds the destination, rank 1 never claims.
	open(9001, addr)
	c, _ := claimStream(t, ctx, conn, ranks[0], 9001, true)
	claims = append(claims, c)
	wantPhase(9001, pb.RoomPhase_ROOM_PHASE_ADMITTED)

	// 9002 claimed by both ranks, nothing sent.
	open(9002, addr)
	for _, r := range ranks {
		c, _ := claimStream(t, ctx, conn, r, 9002, true)
		claims = append(claims, c)
	}
	wantPhase(9002, pb.RoomPhase_ROOM_PHASE_CLAIMED)

	// 9003 transferring: rank 0 sent the first half of its pages.
	open(9003, addr)
	var dest *pb.Destination
	for _, r := range ranks {
		c, dd := claimStream(t, ctx, conn, r, 9003, true)
		claims = append(claims, c)
		dest = dd
	}
	wantPhase(9003, pb.RoomPhase_ROOM_PHASE_CLAIMED)
	n := uint32(len(dest.GetPageIndices()))
	if _, err := roomsTransfer(ctx, ranks[0], dest, 0, 0, n/2, false); err != nil {
		t.Fatalf("room 9003 chunk 0: %v", err)
	}
	wantPhase(9003, pb.RoomPhase_ROOM_PHASE_TRANSFERRING)

	// 9004 succeeded, not released by the decode engine.
	d.handOff(t, ctx, roomsOpen(addr, 9004, 1000), ranks, 4)

	// 9005 queued (no request slot left), both ranks waiting on it.
	open(9005, addr)
	wantPhase(9005, pb.RoomPhase_ROOM_PHASE_QUEUED)
	for _, r := range ranks {
		c, _ := claimStream(t, ctx, conn, r, 9005, false)
		claims = append(claims, c)
	}

	// 9006 waits for a prefill instance that never registers.
	open(9006, absent)
	wantPhase(9006, pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL)

	for room := uint64(9001); room <= 9006; room++ {
		watches[room] = watchStream(t, ctx, conn, room)
	}
	health, _ := healthStream(t, ctx, conn)
	// Every watch has its first event (the room's current state): the
	// watchers are registered at the daemon before the signal. (The claims
	// on room 9005 and on the unopened room 9099 have no first event; they
	// were opened many round trips earlier.)
	for room, w := range watches {
		select {
		case <-w.first:
		case <-w.done:
			t.Fatalf("watch of room %d ended before the signal: %v", room, w.err)
		case <-ctx.Done():
			t.Fatalf("watch of room %d: no first event", room)
		}
	}

	signalled := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.Wait(t, shutdownTimeout+20*time.Second)
	took := time.Since(signalled)
	if code != exitCutShort {
		t.Errorf("exit code %d after SIGTERM with rooms that could not finish, want %d", code, exitCutShort)
	}
	// The rooms were given shutdown_timeout less the flush reserve.
	if least := shutdownTimeout - daemon.FlushReserve(shutdownTimeout); took < least {
		t.Errorf("the daemon exited %s after SIGTERM, before the rooms' %s", took, least)
	}
	t.Logf("exit %d, %s after SIGTERM (shutdown_timeout %s)", code, took, shutdownTimeout)

	for _, c := range append(claims, pending) {
		if !c.ended(t, 10*time.Second) {
			continue
		}
		if len(c.events) == 0 {
			t.Errorf("%s: no event, want the SHUTDOWN failure", c.name)
			continue
		}
		last := c.events[len(c.events)-1]
		f := last.GetFailure()
		if f.GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN || !strings.Contains(f.GetMessage(), shutdownAbortWording) {
			t.Errorf("%s: last event %v (of %d), want a SHUTDOWN failure saying %q", c.name, last, len(c.events), shutdownAbortWording)
		}
		for _, ev := range c.events[:len(c.events)-1] {
			if ev.GetDestination() == nil {
				t.Errorf("%s: event %v before the failure, want only destinations", c.name, ev)
			}
		}
	}
	for room, w := range watches {
		if !w.ended(t, 10*time.Second) {
			continue
		}
		if len(w.events) == 0 {
			t.Errorf("watch of room %d: no event", room)
			continue
		}
		last := w.events[len(w.events)-1]
		r := last.GetRoom()
		switch {
		case !last.GetTerminal():
			t.Errorf("watch of room %d: last event %v is not terminal", room, last)
		case room == 9004:
			if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_RELEASED || r.GetFailure() != nil {
				t.Errorf("watch of room 9004 (succeeded): ended %s %v, want RELEASED", r.GetPhase(), r.GetFailure())
			}
		default:
			want := fmt.Sprintf("Request rid-%d %s", room, shutdownAbortWording)
			if r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED || r.GetPoll() != pb.KVPoll_KV_POLL_FAILED ||
				r.GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_SHUTDOWN || !strings.HasSuffix(r.GetFailure().GetMessage(), want) {
				t.Errorf("watch of room %d: ended %s/%s %v, want FAILED with SHUTDOWN ending %q", room, r.GetPhase(), r.GetPoll(), r.GetFailure(), want)
			}
		}
	}
	if health.ended(t, 10*time.Second) {
		if len(health.events) != 1 || health.events[0].GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health watch after SERVING: %v, want [NOT_SERVING]", health.events)
		}
	}

	out := p.Out.String()
	for _, w := range []string{"graceful stop was cut short", "exit_code=3", "5 rooms failed with FAILURE_CODE_SHUTDOWN", "1 claims on rooms never opened"} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not contain %q:\n%s", w, out)
		}
	}
	// The streams were flushed within the deadline: GracefulStop finished,
	// nothing was cancelled.
	if strings.Contains(out, "graceful stop did not finish") {
		t.Errorf("GracefulStop hit the deadline:\n%s", out)
	}
}

// TestE2EShutdownCleanStop: SIGTERM while a room is claimed; the prefill
// finishes the room during the drain, the claim stream ends with Done, the
// watch with RELEASED, the health watch OK, and the process exits 0 well
// before shutdown_timeout (nothing was waited out).
func TestE2EShutdownCleanStop(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = 30 * time.Second
	d, p := shutdownStartDaemon(t, fmt.Sprintf("server:\n  shutdown_timeout: %s\n", shutdownTimeout))
	ctx := roomsCtx(t)
	const addr = "10.0.9.3:8998"
	rank := d.startRanks(t, roomsInstance(addr, 1, 1, "", nil)...)[0]
	conn := rawConn(t, d.addr)

	// A room handed off and released before: nothing left of it.
	r, _ := d.handOff(t, ctx, roomsOpen(addr, 9101, 500), []*roomsRank{rank}, 4)
	d.release(t, ctx, r)

	const room = 9102
	if _, err := d.c.OpenRoom(ctx, roomsOpen(addr, room, 1000)); err != nil {
		t.Fatal(err)
	}
	claim, dest := claimStream(t, ctx, conn, rank, room, true)
	if _, err := d.c.WaitRoom(ctx, room, pb.RoomPhase_ROOM_PHASE_CLAIMED); err != nil {
		t.Fatal(err)
	}
	watch := watchStream(t, ctx, conn, room)
	health, notServing := healthStream(t, ctx, conn)

	signalled := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-notServing:
	case <-p.Exited():
		t.Fatalf("the daemon exited (%v) before the room finished", p.Err())
	case <-time.After(roomsTimeout):
		t.Fatal("health never became NOT_SERVING after SIGTERM")
	}
	// Draining: the room already open still finishes.
	n := uint32(len(dest.GetPageIndices()))
	if _, err := roomsTransfer(ctx, rank, dest, 0, 0, n, true); err != nil {
		t.Fatalf("the last chunk during the drain: %v", err)
	}
	code := p.Wait(t, shutdownTimeout+10*time.Second)
	took := time.Since(signalled)
	if code != exitOK {
		t.Errorf("exit code %d after a clean stop, want 0", code)
	}
	if limit := shutdownTimeout - daemon.FlushReserve(shutdownTimeout); took >= limit {
		t.Errorf("the daemon exited %s after SIGTERM: it waited out the rooms' %s although the room had finished", took, limit)
	}
	t.Logf("exit %d, %s after SIGTERM (shutdown_timeout %s)", code, took, shutdownTimeout)

	if claim.ended(t, 10*time.Second) {
		if len(claim.events) != 1 || claim.events[0].GetDone().GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
			t.Errorf("claim stream after the destination: %v, want [Done(SUCCEEDED)]", claim.events)
		}
	}
	if watch.ended(t, 10*time.Second) {
		var phases []pb.RoomPhase
		for _, ev := range watch.events {
			phases = append(phases, ev.GetRoom().GetPhase())
		}
		if len(phases) < 3 || phases[len(phases)-2] != pb.RoomPhase_ROOM_PHASE_SUCCEEDED || phases[len(phases)-1] != pb.RoomPhase_ROOM_PHASE_RELEASED ||
			!watch.events[len(watch.events)-1].GetTerminal() {
			t.Errorf("watch phases %v, want ..., SUCCEEDED, RELEASED (terminal)", phases)
		}
	}
	if health.ended(t, 10*time.Second) {
		if len(health.events) != 1 || health.events[0].GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("health watch after SERVING: %v, want [NOT_SERVING]", health.events)
		}
	}
	out := p.Out.String()
	if !strings.Contains(out, "decodeplane stopped") || strings.Contains(out, "cut short") {
		t.Errorf("output of a clean stop:\n%s", out)
	}
}

// TestE2EShutdownDeadlineExits3: an RPC the daemon cannot end by itself (a
// client keeps a reflection stream open) holds GracefulStop until
// shutdown_timeout; Stop cancels it and the exit status says the stop was
// cut short although no room was failed.
func TestE2EShutdownDeadlineExits3(t *testing.T) {
	t.Parallel()
	const shutdownTimeout = time.Second
	d, p := shutdownStartDaemon(t, fmt.Sprintf("server:\n  shutdown_timeout: %s\n", shutdownTimeout))
	ctx := roomsCtx(t)
	rs, err := reflectionpb.NewServerReflectionClient(rawConn(t, d.addr)).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := rs.Recv(); err != nil {
		t.Fatal(err)
	}
	open := record("reflection stream", rs.Recv)

	signalled := time.Now()
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code := p.Wait(t, shutdownTimeout+20*time.Second)
	took := time.Since(signalled)
	if code != exitCutShort {
		t.Errorf("exit code %d after GracefulStop hit the deadline, want %d", code, exitCutShort)
	}
	if took < shutdownTimeout {
		t.Errorf("the daemon exited %s after SIGTERM, before shutdown_timeout %s", took, shutdownTimeout)
	}
	t.Logf("exit %d, %s after SIGTERM (shutdown_timeout %s)", code, took, shutdownTimeout)
	select {
	case <-open.done:
		if open.err == io.EOF || open.err == nil {
			t.Errorf("the reflection stream ended OK, want it cancelled by Stop")
		}
	case <-time.After(10 * time.Second):
		t.Error("the reflection stream did not end")
	}
	out := p.Out.String()
	for _, w := range []string{"graceful stop did not finish before the deadline", "exit_code=3", "GracefulStop did not finish before server.shutdown_timeout", "failed=0 pending_claims_failed=0"} {
		if !strings.Contains(out, w) {
			t.Errorf("output does not contain %q:\n%s", w, out)
		}
	}
}

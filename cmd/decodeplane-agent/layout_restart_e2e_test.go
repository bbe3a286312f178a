//go:build linux

package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The decode engine restarts: its shared-memory file is removed and
// created anew at the same path (the same buffer names, new memory). The
// daemon stays ready, drops the old layout (its health check finds the
// file replaced) or, when the engine registers again first, finds the
// memory replaced then; either way it releases the old buffers at the
// agent, and the next room lands byte for byte in the new file while the
// old one is left alone.

// restart is the engine's restart: the file is removed, then created
// again at the same path, filled with the sentinel and mapped; the free
// lists start over. It returns the old mapping (still mapped).
func (e *testEngine) restart() []byte {
	t := e.t
	t.Helper()
	path := e.layout.GetKv()[0].GetMemory().GetShared().GetPath()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.Repeat([]byte{sentinel}, len(e.mem)), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := syscall.Mmap(int(f.Fd()), 0, len(e.mem), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	old := e.mem
	e.mem, e.want = mem, bytes.Repeat([]byte{sentinel}, len(mem))
	e.free, e.freeRow = e.free[:0], e.freeRow[:0]
	for i := range e.pages {
		e.free = append(e.free, int32((i*173+11)%e.pages))
	}
	for i := range e.rows {
		e.freeRow = append(e.freeRow, int32((i*37+5)%e.rows))
	}
	return old
}

// moveRoom moves a room of n pages from p into the engine and checks every
// byte of the engine's file.
func (c *cluster) moveRoom(e *testEngine, p *layoutPrefill, room uint64, n int) {
	t := c.t
	t.Helper()
	_, pages, row := c.openDeclared(e, p, room, n*c.m.pageSize-5)
	p.fill(room, n)
	c.sendRoom(p, room, n, 3)
	c.waitSucceeded(room)
	e.expect(room, pages, row)
	if err := e.check(); err != nil {
		t.Fatalf("room %d: %v", room, err)
	}
	c.release(room)
	e.give(pages, row)
}

// watchNotServing reports every NOT_SERVING the daemon's health says.
func (c *cluster) watchNotServing() <-chan struct{} {
	t := c.t
	stream, err := healthpb.NewHealthClient(c.dconn).Watch(ctxT(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan struct{}, 16)
	go func() {
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				out <- struct{}{}
			}
		}
	}()
	return out
}

// waitDaemonLog waits until the daemon's log has a line containing every
// word; it wakes on every write of the daemon's output.
func (c *cluster) waitDaemonLog(words ...string) string {
	t := c.t
	t.Helper()
	deadline := time.NewTimer(e2eTimeout)
	defer deadline.Stop()
	for {
		out, changed := c.daemon.Out.Snapshot()
		for _, line := range strings.Split(out, "\n") {
			ok := true
			for _, w := range words {
				ok = ok && strings.Contains(line, w)
			}
			if ok {
				return line
			}
		}
		select {
		case <-changed:
		case <-c.daemon.Exited():
			t.Fatal("the daemon exited")
		case <-deadline.C:
			t.Fatalf("the daemon never logged %q", words)
		}
	}
}

// TestE2EEngineLayoutRestart: a room lands in the engine's file; the
// engine restarts (its file removed and created again at the same path);
// the daemon's health check drops the layout, says so once (WARN, and
// GetStatus engine_layouts' dropped), refuses declarations on the shard
// and stays SERVING for three health intervals; the engine registers its
// layout again (not already: the memory is new) and the next room lands
// byte for byte in the new file, none of it in the old one.
func TestE2EEngineLayoutRestart(t *testing.T) {
	const interval = 200 * time.Millisecond // newCluster's transfer.delegate.health_interval
	c, e, reg := newLayoutCluster(t, nil)
	p := c.newLayoutPrefill("10.7.0.1:8998", 2)
	c.moveRoom(e, p, 801, 7)
	notServing := c.watchNotServing()

	old := e.restart()
	oldImage := bytes.Clone(old)
	// The agent's reason: the file is missing, or not the one registered,
	// as the health check finds it between the removal and the creation.
	warn := c.waitDaemonLog("decode engine layout dropped", "decode_tp=0", "engine/dp0/tp0/", "registers its layout again")
	t.Logf("daemon: %s", warn)
	st, err := c.admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ls := st.GetEngineLayouts(); len(ls) != 1 || !strings.Contains(ls[0].GetDropped(), "refused its buffers on a health check") || !st.GetReady() {
		t.Fatalf("GetStatus: ready %v, engine_layouts %v; want ready, the layout dropped with the agent's reason", st.GetReady(), ls)
	}
	c.openQueued(p, 802) // 40 tokens: 3 pages
	pages, row := e.alloc(3)
	_, err = c.rooms.DeclareDestination(ctxT(t), &pb.DeclareDestinationRequest{Room: 802, PageIndices: pages, MetadataSlot: row})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "was dropped") {
		t.Fatalf("DeclareDestination on the dropped layout = %v; want FailedPrecondition saying it was dropped", err)
	}
	e.give(pages, row)
	if _, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: 802}); err != nil {
		t.Fatal(err)
	}
	window := time.NewTimer(3 * interval)
	select {
	case <-notServing:
		t.Fatal("the daemon's health went NOT_SERVING when the engine's layout was dropped")
	case <-window.C:
	}

	again, err := c.rooms.RegisterEngineLayout(ctxT(t), &pb.RegisterEngineLayoutRequest{Layout: e.layout})
	if err != nil || again.GetAlready() || again.GetLayoutId() != reg.GetLayoutId() {
		t.Fatalf("RegisterEngineLayout after the restart = %v, %v; want registered anew (not already), the same layout id", again, err)
	}
	c.moveRoom(e, p, 803, 10)
	if !bytes.Equal(old, oldImage) {
		t.Error("a byte landed in the engine's old, removed file")
	}
	select {
	case <-notServing:
		t.Error("the daemon's health went NOT_SERVING")
	default:
	}
}

// TestE2EEngineLayoutRestartBeforeHealthCheck: the engine restarts and
// registers its layout again before a health check ran (health every
// hour): the agent refuses to confirm the same layout (its file was
// replaced), so the daemon releases the old buffers and registers the new
// memory; the next room lands in the new file.
func TestE2EEngineLayoutRestartBeforeHealthCheck(t *testing.T) {
	c, e, _ := newLayoutCluster(t, nil, "transfer.delegate.health_interval=1h")
	p := c.newLayoutPrefill("10.7.0.2:8998", 2)
	c.moveRoom(e, p, 811, 4)
	old := e.restart()
	oldImage := bytes.Clone(old)
	again, err := c.rooms.RegisterEngineLayout(context.Background(), &pb.RegisterEngineLayoutRequest{Layout: e.layout})
	if err != nil || again.GetAlready() {
		t.Fatalf("RegisterEngineLayout after the restart = %v, %v; want registered anew (not already)", again, err)
	}
	c.moveRoom(e, p, 812, 6)
	if !bytes.Equal(old, oldImage) {
		t.Error("a byte landed in the engine's old, removed file")
	}
}

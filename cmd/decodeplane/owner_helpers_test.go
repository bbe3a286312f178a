package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The engine-owner end-to-end tests' decode engine and prefill rank, both
// played by the test process over real gRPC against the daemon binary.
// Their pool: pages of 16 tokens, 64 pages (kv_pool.total_tokens 1024),
// 48 metadata rows; a room is a 256-token prompt, 16 pages.

const (
	ownerPageSize  = 16
	ownerPages     = 64
	ownerRows      = 48
	ownerPromptLen = 256
	ownerRoomPages = ownerPromptLen / ownerPageSize
)

// ownerPool are the daemon settings of that pool, the engine as its owner.
func ownerPool() []string {
	return []string{"--page-owner", "engine", "--set", fmt.Sprintf("kv_pool.page_size=%d", ownerPageSize),
		"--set", fmt.Sprintf("kv_pool.total_tokens=%d", ownerPages*ownerPageSize), "--set", "kv_pool.request_slots=8",
		"--set", "timeouts.heartbeat_interval=10m"}
}

// ownerDial connects to addr with a reconnect back-off short enough to
// find a restarted daemon at once; the connection closes with the test.
func ownerDial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond}, MinConnectTimeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ownerAlloc is what the engine allocated for a room.
type ownerAlloc struct {
	pages []int32
	row   int32
}

// ownerEngine is a decode engine that owns its pages: it allocates each
// room's pages and metadata row from its own free lists, declares them
// (DeclareDestination), gives them back when it finished decoding a room
// (ReleaseRoom) or when a failed room's last event says its pages are
// reusable, and reports its capacity after every change. It fails the test
// if it would hand a page or row out twice.
type ownerEngine struct {
	t     *testing.T
	rooms pb.RoomsClient
	capc  pb.CapacityClient
	admin pb.AdminClient

	mu        sync.Mutex
	freePages []int32
	freeRows  []int32
	pageOwner map[int32]uint64
	rowOwner  map[int32]uint64
	allocs    map[uint64]ownerAlloc
}

func newOwnerEngine(t *testing.T, conn *grpc.ClientConn) *ownerEngine {
	e := &ownerEngine{t: t, rooms: pb.NewRoomsClient(conn), capc: pb.NewCapacityClient(conn), admin: pb.NewAdminClient(conn),
		pageOwner: map[int32]uint64{}, rowOwner: map[int32]uint64{}, allocs: map[uint64]ownerAlloc{}}
	for p := int32(ownerPages - 1); p >= 0; p-- {
		e.freePages = append(e.freePages, p)
	}
	for r := int32(ownerRows - 1); r >= 0; r-- {
		e.freeRows = append(e.freeRows, r)
	}
	return e
}

// open opens a room of the prompt for the prefill at bootstrap and waits
// until it waits for its declaration (QUEUED).
func (e *ownerEngine) open(ctx context.Context, room uint64, bootstrap string) {
	e.t.Helper()
	resp, err := e.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: fmt.Sprint("req-", room), BootstrapAddr: bootstrap, Room: room,
		PromptLen: ownerPromptLen, MaxNewTokens: 16})
	if err != nil {
		e.t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	if resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_QUEUED {
		e.watch(ctx, room, func(ev *pb.RoomEvent) bool { return ev.GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_QUEUED })
	}
}

// take allocates a room's pages and row from the free lists.
func (e *ownerEngine) take(room uint64) ownerAlloc {
	e.t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.freePages) < ownerRoomPages || len(e.freeRows) == 0 {
		e.t.Fatalf("room %d: the engine has %d free pages and %d free rows", room, len(e.freePages), len(e.freeRows))
	}
	n := len(e.freePages) - ownerRoomPages
	a := ownerAlloc{pages: slices.Clone(e.freePages[n:]), row: e.freeRows[len(e.freeRows)-1]}
	e.freePages, e.freeRows = e.freePages[:n], e.freeRows[:len(e.freeRows)-1]
	for _, p := range a.pages {
		if o, held := e.pageOwner[p]; held {
			e.t.Errorf("page %d handed to room %d while room %d holds it", p, room, o)
		}
		e.pageOwner[p] = room
	}
	if o, held := e.rowOwner[a.row]; held {
		e.t.Errorf("metadata row %d handed to room %d while room %d holds it", a.row, room, o)
	}
	e.rowOwner[a.row] = room
	e.allocs[room] = a
	return a
}

// declare allocates and declares a room's destination; the daemon must
// accept it.
func (e *ownerEngine) declare(ctx context.Context, room uint64) ownerAlloc {
	e.t.Helper()
	a := e.take(room)
	if err := e.declareAlloc(ctx, room, a); err != nil {
		e.t.Fatalf("DeclareDestination(%d, pages %v, row %d): %v", room, a.pages, a.row, err)
	}
	e.report(ctx)
	return a
}

// declareAlloc declares a as room's destination (no allocation: the tests
// use it to try pages another room's hand-off still holds).
func (e *ownerEngine) declareAlloc(ctx context.Context, room uint64, a ownerAlloc) error {
	_, err := e.rooms.DeclareDestination(ctx, &pb.DeclareDestinationRequest{Room: room, PageIndices: a.pages, MetadataSlot: a.row})
	return err
}

// give puts room's pages and row back on the free lists.
func (e *ownerEngine) give(ctx context.Context, room uint64) {
	e.t.Helper()
	e.mu.Lock()
	a, ok := e.allocs[room]
	if !ok {
		e.mu.Unlock()
		e.t.Fatalf("room %d: the engine allocated nothing for it", room)
	}
	delete(e.allocs, room)
	for _, p := range a.pages {
		delete(e.pageOwner, p)
	}
	delete(e.rowOwner, a.row)
	e.freePages = append(e.freePages, a.pages...)
	e.freeRows = append(e.freeRows, a.row)
	e.mu.Unlock()
	e.report(ctx)
}

// finish is the end of a room the engine decoded: released, its pages free.
func (e *ownerEngine) finish(ctx context.Context, room uint64) {
	e.t.Helper()
	if _, err := e.rooms.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room}); err != nil {
		e.t.Fatalf("ReleaseRoom(%d): %v", room, err)
	}
	e.give(ctx, room)
}

// watch watches room (from its history) until done(event) holds and
// returns that event; the watch's end first fails the test.
func (e *ownerEngine) watch(ctx context.Context, room uint64, done func(*pb.RoomEvent) bool) *pb.RoomEvent {
	e.t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := e.rooms.WatchRoom(wctx, &pb.WatchRoomRequest{Room: room, History: true})
	if err != nil {
		e.t.Fatalf("WatchRoom(%d): %v", room, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			e.t.Fatalf("WatchRoom(%d) ended: %v", room, err)
		}
		if done(ev) {
			return ev
		}
	}
}

// awaitReusable waits for the room's last event (pages reusable), checks
// the watch ends there, and gives the pages back.
func (e *ownerEngine) awaitReusable(ctx context.Context, room uint64) *pb.RoomEvent {
	e.t.Helper()
	stream, err := e.rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room})
	if err != nil {
		e.t.Fatalf("WatchRoom(%d): %v", room, err)
	}
	var last *pb.RoomEvent
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			e.t.Fatalf("WatchRoom(%d): %v", room, err)
		}
		last = ev
	}
	if !last.GetPagesReusable() {
		e.t.Fatalf("room %d's watch ended with %v, not the pages-reusable event", room, last)
	}
	e.give(ctx, room)
	return last
}

// report sends what the engine has free (ReportCapacity).
func (e *ownerEngine) report(ctx context.Context) {
	e.t.Helper()
	e.mu.Lock()
	pages, rows, running := len(e.freePages), len(e.freeRows), len(e.allocs)
	e.mu.Unlock()
	if _, err := e.capc.ReportCapacity(ctx, &pb.ReportCapacityRequest{TokensFree: uint64(pages * ownerPageSize), PagesFree: uint64(pages),
		ReqSlotsFree: uint32(rows), MetadataSlotsFree: uint32(rows), Running: uint32(running)}); err != nil {
		e.t.Fatalf("ReportCapacity: %v", err)
	}
}

// holds is GetStatus's hand-off ledger of shard 0.
func (e *ownerEngine) holds(ctx context.Context) *pb.HandoffHolds {
	e.t.Helper()
	st, err := e.admin.GetStatus(ctx, &pb.GetStatusRequest{})
	if err != nil {
		e.t.Fatal(err)
	}
	return st.GetShards()[0].GetHolds()
}

// wantHeld checks that declaring a's pages for room is refused, PAGE_HELD
// naming holder (draining as given), and gives room's allocation back
// untouched.
func (e *ownerEngine) wantHeld(ctx context.Context, room, holder uint64, a ownerAlloc, draining bool) {
	e.t.Helper()
	err := e.declareAlloc(ctx, room, a)
	md := map[string]string{}
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == "PAGE_HELD" {
			md = ei.GetMetadata()
		}
	}
	if status.Code(err) != codes.FailedPrecondition || md["holder"] != fmt.Sprint(holder) || md["draining"] != fmt.Sprint(draining) {
		e.t.Fatalf("declaring room %d's pages for room %d = %v (%v); want PAGE_HELD by room %d, draining %v", holder, room, err, md, holder, draining)
	}
}

// checkClean ends a test: the engine's free lists are whole, the daemon
// holds nothing (GetStatus), and a declaration of every page (and as many
// rows) is accepted; those rooms are then aborted and their pages are
// reusable at once (no prefill ever claimed them).
func (e *ownerEngine) checkClean(ctx context.Context, bootstrap string) {
	e.t.Helper()
	e.mu.Lock()
	free, rows, left := len(e.freePages), len(e.freeRows), len(e.allocs)
	e.mu.Unlock()
	if free != ownerPages || rows != ownerRows || left != 0 {
		e.t.Fatalf("the engine has %d of %d pages and %d of %d rows free, %d rooms allocated; want everything back", free, ownerPages, rows, ownerRows, left)
	}
	if h := e.holds(ctx); h.GetHeld() != 0 || h.GetHeldPages() != 0 || h.GetDraining() != 0 || h.GetDrainingPages() != 0 || h.GetQueued() != 0 {
		e.t.Fatalf("the daemon's hand-off ledger at the end = %v; want nothing held", h)
	}
	var all []uint64
	for i := range uint64(ownerPages / ownerRoomPages) {
		room := 9000 + i
		e.open(ctx, room, bootstrap)
		e.declare(ctx, room)
		all = append(all, room)
	}
	if h := e.holds(ctx); h.GetHeldPages() != ownerPages {
		e.t.Fatalf("after declaring every page: %v; want all %d pages held", h, ownerPages)
	}
	for _, room := range all {
		if _, err := e.rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: "end of test"}); err != nil {
			e.t.Fatal(err)
		}
		e.awaitReusable(ctx, room)
	}
	if h := e.holds(ctx); h.GetHeld() != 0 || h.GetHeldPages() != 0 || h.GetDraining() != 0 {
		e.t.Fatalf("the hand-off ledger after the last rooms = %v; want nothing held", h)
	}
}

// ownerRank is one prefill rank played by the test: it claims rooms and
// writes their KV itself (ReportTransfer), or asks the daemon to move it
// (Transfer, on the delegated path).
type ownerRank struct {
	t     *testing.T
	rooms pb.RoomsClient
	rank  *pb.PrefillRank
}

// claim claims room and returns its destination and the claim stream's
// next event (its end).
func (p *ownerRank) claim(ctx context.Context, room uint64) (*pb.Destination, func() (*pb.DestinationEvent, error)) {
	p.t.Helper()
	stream, err := p.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: p.rank})
	if err != nil {
		p.t.Fatalf("AwaitDestination(%d): %v", room, err)
	}
	ev, err := stream.Recv()
	if err != nil || ev.GetDestination() == nil {
		p.t.Fatalf("AwaitDestination(%d) = %v, %v; want a destination", room, ev, err)
	}
	return ev.GetDestination(), stream.Recv
}

// report reports chunk i (pages [off, off+n) of dst) written, or failed.
func (p *ownerRank) report(ctx context.Context, dst *pb.Destination, i, off, n uint32, ok bool) error {
	ps := dst.GetPageSize()
	last := off+n == uint32(len(dst.GetPageIndices()))
	tokens := min((off+n)*ps, dst.GetFillLen()) - off*ps
	r := &pb.ReportTransferRequest{Room: dst.GetRoom(), Rank: p.rank, ChunkIndex: i, PageOffset: off, NumPages: n, Last: last, Success: ok,
		Bytes: uint64(tokens) * dst.GetTokenBytes(), Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}
	if last {
		r.Bytes += dst.GetStateBytes()
		r.MetadataRoomMarker = dst.GetRoom()
	}
	if !ok {
		r.Bytes, r.MetadataRoomMarker, r.FailureReason = 0, 0, "rdma write failed"
	}
	_, err := p.rooms.ReportTransfer(ctx, r)
	return err
}

// ack acknowledges the end of dst's generation (incarnation as given).
func (p *ownerRank) ack(ctx context.Context, room uint64, attempt uint32, incarnation uint64) (*pb.AckRoomEndResponse, error) {
	return p.rooms.AckRoomEnd(ctx, &pb.AckRoomEndRequest{Room: room, Rank: p.rank, Attempt: attempt, Incarnation: incarnation})
}

//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The engine-layout end-to-end tests: the test process plays a decode
// engine that owns its pages (kv_pool.owner: engine) and keeps its KV in an
// SGLang-shaped layout — one buffer per layer and K/V, token-major pages,
// three aux columns of which one carries the room marker — in a
// shared-memory file it created and maps. It registers the layout with the
// daemon binary, which registers the buffers with the reference agent
// binary in the engine's memory; the engine allocates each room's pages
// and metadata row from its own free lists and declares them; two prefill
// ranks (attention TP 2, decode TP 1) register their own buffers at the
// agent, claim and Transfer. The test reads the engine's own mapping.

// engineItem is one page of one layer buffer on the decode rank (TP 1: all
// 8 heads), prefillItem on a prefill rank of TP 2 (4 heads).
func (m model) engineItem(tp int) int { return m.pageSize * m.headsPerRank(tp) * m.headBytes() }

// auxRowLen is every aux column's row (16 int32 ids; the marker column's 8
// uint64s), auxNames the engine's columns, the marker's last.
const auxRowLen = 64

var auxNames = []string{"output_ids", "cached_tokens", "bootstrap_room"}

// testEngine is the decode engine: its buffers in one shared-memory file,
// its free lists of pages and metadata rows, and the image every byte of
// the file must match (want).
type testEngine struct {
	t       *testing.T
	m       model
	dir     string
	mem     []byte
	want    []byte
	kvOff   [2][]int // [K/V][layer] → the buffer's offset in the file
	auxOff  []int
	pages   int
	rows    int
	free    []int32 // free pages, taken from the end
	freeRow []int32
	layout  *pb.EngineLayout
}

// sentinel fills the engine's file: a byte nothing writes.
const sentinel = 0xee

// newTestEngine creates the file (under /dev/shm when it is there) with
// every buffer at a 4096-aligned offset, and free lists in a scrambled
// order (the engine's allocator is not the daemon's).
func newTestEngine(t *testing.T, m model, pages, rows int) *testEngine {
	e := &testEngine{t: t, m: m, pages: pages, rows: rows}
	item := m.engineItem(1)
	align := func(n int) int { return (n + 4095) &^ 4095 }
	off := 0
	e.layout = &pb.EngineLayout{Marker: "engine/dp0/tp0/aux/" + auxNames[len(auxNames)-1]}
	for kv, kvName := range []string{"k", "v"} {
		for l := range m.layers {
			e.kvOff[kv] = append(e.kvOff[kv], off)
			e.layout.Kv = append(e.layout.Kv, &pb.EngineKVBuffer{Name: fmt.Sprintf("engine/dp0/tp0/%s/%d", kvName, l), Layer: uint32(l), Value: kv == 1,
				ItemLen: uint64(item), Length: uint64(pages * item)})
			off = align(off + pages*item)
		}
	}
	for _, a := range auxNames {
		e.auxOff = append(e.auxOff, off)
		e.layout.Aux = append(e.layout.Aux, &pb.EngineAuxBuffer{Name: "engine/dp0/tp0/aux/" + a, RowLen: auxRowLen, Length: uint64(rows * auxRowLen)})
		off = align(off + rows*auxRowLen)
	}
	var path string
	e.dir, path, e.mem = engineShm(t, "engine-kv", off, sentinel)
	e.want = bytes.Repeat([]byte{sentinel}, off)
	at := func(o int) *pb.EngineMemory {
		return &pb.EngineMemory{Kind: &pb.EngineMemory_Shared{Shared: &pb.EngineSharedMemory{Path: path, Offset: uint64(o)}}}
	}
	for i, b := range e.layout.Kv {
		b.Memory = at(e.kvOff[i/m.layers][i%m.layers])
	}
	for i, a := range e.layout.Aux {
		a.Memory = at(e.auxOff[i])
	}
	for i := range pages {
		e.free = append(e.free, int32((i*173+11)%pages))
	}
	for i := range rows {
		e.freeRow = append(e.freeRow, int32((i*37+5)%rows))
	}
	return e
}

// alloc takes n pages and a metadata row from the engine's free lists.
func (e *testEngine) alloc(n int) (pages []int32, row int32) {
	if n > len(e.free) || len(e.freeRow) == 0 {
		e.t.Fatalf("the engine's pool is empty")
	}
	pages = append(pages, e.free[len(e.free)-n:]...)
	e.free = e.free[:len(e.free)-n]
	row, e.freeRow = e.freeRow[len(e.freeRow)-1], e.freeRow[:len(e.freeRow)-1]
	return pages, row
}

// give returns pages and a row to the free lists (only once the daemon said
// they are reusable).
func (e *testEngine) give(pages []int32, row int32) {
	e.free = append(e.free, pages...)
	e.freeRow = append(e.freeRow, row)
}

// tokenRow is the bytes of token s of logical page i of room in one layer
// buffer, over heads [h0, h0+hp): value() of the global heads.
func (m model) tokenRows(room uint64, layer, kv, i, h0, hp int) []byte {
	hb := m.headBytes()
	out := make([]byte, m.pageSize*hp*hb)
	for s := range m.pageSize {
		for h := range hp {
			for b := range hb {
				out[(s*hp+h)*hb+b] = value(room, layer, kv, i*m.pageSize+s, h0+h, b)
			}
		}
	}
	return out
}

// auxBytes is aux column a's row for room, as every prefill rank holds it
// (the first output ids are the same on every TP rank).
func auxBytes(room uint64, a int) []byte {
	out := make([]byte, auxRowLen)
	for b := range out {
		out[b] = value(room, 100+a, 0, 0, 0, b)
	}
	return out
}

// expect records in the engine's image what a room's hand-off must have
// written: every page of every layer buffer, the aux rows but the
// marker's, and the marker's first 8 bytes.
func (e *testEngine) expect(room uint64, pages []int32, row int32) {
	m, item := e.m, e.m.engineItem(1)
	for i, d := range pages {
		for kv := range 2 {
			for l := range m.layers {
				copy(e.want[e.kvOff[kv][l]+int(d)*item:], m.tokenRows(room, l, kv, i, 0, m.headsPerRank(1)))
			}
		}
	}
	for a := range len(auxNames) - 1 {
		copy(e.want[e.auxOff[a]+int(row)*auxRowLen:], auxBytes(room, a))
	}
	binary.LittleEndian.PutUint64(e.want[e.auxOff[len(auxNames)-1]+int(row)*auxRowLen:], room)
}

// check compares the engine's mapping with its image: every byte of the
// file, and names the first difference.
func (e *testEngine) check() error {
	if bytes.Equal(e.mem, e.want) {
		return nil
	}
	m, item := e.m, e.m.engineItem(1)
	for off := range e.want {
		if e.mem[off] == e.want[off] {
			continue
		}
		for kv := range 2 {
			for l := range m.layers {
				if o := off - e.kvOff[kv][l]; o >= 0 && o < e.pages*item {
					p, r := o/item, o%item
					tok, h, b := r/(m.headsPerRank(1)*m.headBytes()), r/m.headBytes()%m.headsPerRank(1), r%m.headBytes()
					return fmt.Errorf("engine page %d layer %d %s token %d head %d byte %d = %#02x, want %#02x", p, l, [2]string{"K", "V"}[kv], tok, h, b, e.mem[off], e.want[off])
				}
			}
		}
		for a, ao := range e.auxOff {
			if o := off - ao; o >= 0 && o < e.rows*auxRowLen {
				return fmt.Errorf("engine aux %s row %d byte %d = %#02x, want %#02x", auxNames[a], o/auxRowLen, o%auxRowLen, e.mem[off], e.want[off])
			}
		}
		return fmt.Errorf("engine file byte %d (between buffers) = %#02x, want %#02x", off, e.mem[off], e.want[off])
	}
	return nil
}

// layoutPrefill is a prefill instance of TP 2 whose ranks keep their KV in
// their own per-layer buffers at the agent (agent memory, filled with
// WriteBuffer) named from a prefix, as the engine layout's contract says.
type layoutPrefill struct {
	c     *cluster
	addr  string
	tp    int
	pages int
	next  int               // the next free page of the prefill's own numbering
	base  map[uint64]int    // where each room's pages begin there
	rows  map[uint64]uint32 // each room's prefill aux row
}

func (p *layoutPrefill) rank(r int) *pb.PrefillRank {
	return &pb.PrefillRank{BootstrapAddr: p.addr, TpRank: uint32(r)}
}
func (p *layoutPrefill) prefix(r int) string { return fmt.Sprintf("prefill/%s/tp%d", p.addr, r) }

// srcPage is where the prefill keeps logical page i of room: its own
// numbering, downwards from the top of its buffers.
func (p *layoutPrefill) srcPage(room uint64, i int) int32 {
	return int32(p.pages - 1 - p.base[room] - i)
}

// newLayoutPrefill registers the prefill's ranks with the daemon and their
// buffers with the agent: per layer a K and a V buffer of 4 heads, and the
// three aux columns.
func (c *cluster) newLayoutPrefill(addr string, tp int) *layoutPrefill {
	t := c.t
	t.Helper()
	p := &layoutPrefill{c: c, addr: addr, tp: tp, pages: 64, base: map[uint64]int{}, rows: map[uint64]uint32{}}
	item := c.m.engineItem(tp)
	req := &transferv1.RegisterBuffersRequest{}
	for r := range tp {
		for _, n := range []string{"k", "v"} {
			for l := range c.m.layers {
				req.Buffers = append(req.Buffers, &transferv1.Buffer{Name: fmt.Sprintf("%s/%s/%d", p.prefix(r), n, l), Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV,
					Length: uint64(p.pages * item), ItemSize: uint64(item)})
			}
		}
		for a := range auxNames {
			req.Buffers = append(req.Buffers, &transferv1.Buffer{Name: fmt.Sprintf("%s/aux/%d", p.prefix(r), a), Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV,
				Length: 16 * auxRowLen, ItemSize: auxRowLen})
		}
	}
	if _, err := c.xfer.RegisterBuffers(ctxT(t), req); err != nil {
		t.Fatalf("RegisterBuffers: %v", err)
	}
	for r := range tp {
		if _, err := c.boot.RegisterPrefill(ctxT(t), &pb.RegisterPrefillRequest{BootstrapAddr: addr, RankEndpoint: fmt.Sprintf("10.9.1.%d:%d", r+1, 17000+r),
			Parallel: &pb.ParallelInfo{AttnTpSize: uint32(tp), AttnTpRank: uint32(r), AttnCpSize: 1, AttnDpSize: 1, PpSize: 1},
			PageSize: uint32(c.m.pageSize), KvCacheDtype: "bf16", InstanceId: "prefill-" + addr}); err != nil {
			t.Fatalf("RegisterPrefill(%s rank %d): %v", addr, r, err)
		}
	}
	return p
}

// fill writes a room's KV (n logical pages) and aux rows into every rank's
// buffers; the marker column's row holds junk the daemon must not copy.
func (p *layoutPrefill) fill(room uint64, n int) {
	t := p.c.t
	t.Helper()
	if p.next+n > p.pages {
		p.next = 0
	}
	p.base[room], p.rows[room] = p.next, uint32(len(p.rows)%16)
	p.next += n
	m, item := p.c.m, p.c.m.engineItem(p.tp)
	hp := m.headsPerRank(p.tp)
	write := func(name string, off int, data []byte) {
		if _, err := p.c.xfer.WriteBuffer(ctxT(t), &transferv1.WriteBufferRequest{Name: name, Offset: uint64(off), Data: data}); err != nil {
			t.Fatalf("WriteBuffer(%s at %d): %v", name, off, err)
		}
	}
	for r := range p.tp {
		for kv, kvName := range []string{"k", "v"} {
			for l := range m.layers {
				for i := range n {
					write(fmt.Sprintf("%s/%s/%d", p.prefix(r), kvName, l), int(p.srcPage(room, i))*item, m.tokenRows(room, l, kv, i, r*hp, hp))
				}
			}
		}
		for a := range auxNames {
			row := auxBytes(room, a)
			if a == len(auxNames)-1 {
				row = bytes.Repeat([]byte{0x5a}, auxRowLen)
			}
			write(fmt.Sprintf("%s/aux/%d", p.prefix(r), a), int(p.rows[room])*auxRowLen, row)
		}
	}
}

// openDeclared opens a room of promptLen tokens, waits until it waits for
// its destination, declares pages and a row from the engine's free lists,
// and claims it from every rank; it returns the destinations.
func (c *cluster) openDeclared(e *testEngine, p *layoutPrefill, room uint64, promptLen int) (dests []*pb.Destination, pages []int32, row int32) {
	t := c.t
	t.Helper()
	if _, err := c.rooms.OpenRoom(ctxT(t), &pb.OpenRoomRequest{Rid: fmt.Sprintf("req-%d", room), BootstrapAddr: p.addr, Room: room,
		PromptLen: uint32(promptLen), MaxNewTokens: 8}); err != nil {
		t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	c.waitPhase(room, func(ph pb.RoomPhase) bool { return ph == pb.RoomPhase_ROOM_PHASE_QUEUED }, "queued for its declaration")
	pages, row = e.alloc((promptLen + c.m.pageSize - 1) / c.m.pageSize)
	if _, err := c.rooms.DeclareDestination(ctxT(t), &pb.DeclareDestinationRequest{Room: room, PageIndices: pages, MetadataSlot: row}); err != nil {
		t.Fatalf("DeclareDestination(%d): %v", room, err)
	}
	for r := range p.tp {
		ctx, cancel := context.WithCancel(ctxT(t))
		stream, err := c.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: p.rank(r)})
		if err != nil {
			t.Fatalf("AwaitDestination(%d, rank %d): %v", room, r, err)
		}
		ev, err := stream.Recv()
		cancel()
		if err != nil || ev.GetDestination() == nil {
			t.Fatalf("AwaitDestination(%d, rank %d) = %v, %v; want a destination", room, r, ev, err)
		}
		dests = append(dests, ev.GetDestination())
	}
	return dests, pages, row
}

// sendRoom sends every rank's pages in chunks of chunkPages with Transfer,
// the last with the marker and the prefill's aux row; it returns the bytes
// the daemon says it moved.
func (c *cluster) sendRoom(p *layoutPrefill, room uint64, n, chunkPages int) uint64 {
	t := c.t
	t.Helper()
	var moved uint64
	for r := range p.tp {
		for ci, off := 0, 0; off < n; ci, off = ci+1, off+chunkPages {
			k := min(chunkPages, n-off)
			req := &pb.TransferRequest{Room: room, Rank: p.rank(r), ChunkIndex: uint32(ci), PageOffset: uint32(off), NumPages: uint32(k),
				Last: off+k == n, Source: &pb.TransferSource{Buffer: p.prefix(r)}}
			for i := off; i < off+k; i++ {
				req.Source.PageIndices = append(req.Source.PageIndices, p.srcPage(room, i))
			}
			if req.Last {
				req.Aux, req.Source.AuxRow = &pb.Aux{RoomMarker: room}, proto.Uint32(p.rows[room])
			}
			resp, err := c.rooms.Transfer(ctxT(t), req)
			if err != nil {
				t.Fatalf("Transfer(room %d rank %d chunk %d): %v", room, r, ci, err)
			}
			moved += resp.GetBytes()
		}
	}
	return moved
}

// newLayoutCluster starts the agent (admitting the engine's shared-memory
// directory) and a daemon whose decode engine owns its pages (decode TP
// 1), and registers the engine's layout.
func newLayoutCluster(t *testing.T, agentArgs []string, daemonSets ...string) (*cluster, *testEngine, *pb.RegisterEngineLayoutResponse) {
	t.Helper()
	const pages, rows = 512, 96 // kv_pool.total_tokens 8192 / page 16; 2 × (16 + 32) metadata slots
	e := newTestEngine(t, gqa, pages, rows)
	c := newCluster(t, gqa, 1, append([]string{"--shared-memory-dirs", e.dir}, agentArgs...), append([]string{"kv_pool.owner=engine"}, daemonSets...)...)
	reg, err := c.rooms.RegisterEngineLayout(ctxT(t), &pb.RegisterEngineLayoutRequest{Layout: e.layout})
	if err != nil {
		t.Fatalf("RegisterEngineLayout: %v", err)
	}
	return c, e, reg
}

// TestE2EEngineLayoutBytes: rooms in the engine's own layout, through the
// real daemon and agent binaries, land byte for byte in the engine's
// shared memory — every page of every layer's K and V buffer with both
// prefill ranks' head halves, every aux row but the marker's copied from
// the prefill's aux row, the marker in the marker column — and nothing
// else of the file changes. The bytes the daemon counts are SGLang's:
// whole pages, buffer by buffer, plus the aux rows and the marker.
func TestE2EEngineLayoutBytes(t *testing.T) {
	start := time.Now()
	c, e, reg := newLayoutCluster(t, nil)
	p := c.newLayoutPrefill("10.5.0.1:8998", 2)
	st, err := c.admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ls := st.GetEngineLayouts(); len(ls) != 1 || ls[0].GetLayoutId() != reg.GetLayoutId() || len(ls[0].GetLayout().GetKv()) != 2*gqa.layers ||
		ls[0].GetLayout().GetKv()[0].GetMemory() != nil {
		t.Fatalf("GetStatus.engine_layouts = %v; want the engine's layout (id %x) without its memory", ls, reg.GetLayoutId())
	}
	pageBytes := uint64(2 * gqa.layers * gqa.engineItem(2)) // per prefill rank: its 4 heads of every K and V buffer
	auxBytes := uint64(8 + 2*auxRowLen)                     // the marker, and the two other columns' rows
	type sent struct {
		room  uint64
		n     int
		pages []int32
		row   int32
	}
	send := func(rooms ...sent) {
		for i := range rooms {
			r := &rooms[i]
			var dests []*pb.Destination
			dests, r.pages, r.row = c.openDeclared(e, p, r.room, r.n*gqa.pageSize-5)
			for rk, d := range dests {
				tg := d.GetTargets()
				if d.GetPageBytes() != pageBytes || d.GetAuxBytes() != auxBytes || d.GetTokenBytes() != 0 || len(tg) != 1 || tg[0].GetLayoutId() != reg.GetLayoutId() {
					t.Fatalf("rank %d destination = %v; want page_bytes %d, aux_bytes %d, token_bytes 0, one target with layout id %x", rk, d, pageBytes, auxBytes, reg.GetLayoutId())
				}
			}
			p.fill(r.room, r.n)
		}
		for _, r := range rooms {
			moved := c.sendRoom(p, r.room, r.n, 3)
			c.waitSucceeded(r.room)
			want := uint64(p.tp) * (uint64(r.n)*pageBytes + auxBytes)
			got, err := c.rooms.GetRoom(ctxT(t), &pb.GetRoomRequest{Room: r.room})
			if err != nil {
				t.Fatal(err)
			}
			if moved != want || got.GetBytesTransferred() != want {
				t.Errorf("room %d: Transfer answered %d bytes, the room counts %d; want %d (%d ranks × (%d pages × %d + %d))", r.room, moved, got.GetBytesTransferred(), want, p.tp, r.n, pageBytes, auxBytes)
			}
			for _, cov := range got.GetCoverage() {
				if cov.GetBytes() != want/uint64(p.tp) || cov.GetPagesLanded() != uint32(r.n) || !cov.GetLastLanded() {
					t.Errorf("room %d coverage %v; want %d pages, %d bytes, last landed", r.room, cov, r.n, want/uint64(p.tp))
				}
			}
			t.Logf("room %d: %d pages, %d bytes moved into the engine's buffers (%d per prefill rank)", r.room, r.n, want, want/uint64(p.tp))
			e.expect(r.room, r.pages, r.row)
		}
		if err := e.check(); err != nil {
			t.Fatal(err)
		}
		for _, r := range rooms {
			c.release(r.room)
			e.give(r.pages, r.row)
		}
	}
	// Two rooms in flight together, then one reusing their pages.
	send(sent{room: 701, n: 7}, sent{room: 702, n: 3})
	send(sent{room: 703, n: 10})
	st, err = c.admin.GetStatus(ctxT(t), &pb.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if h := st.GetShards()[0].GetHolds(); h.GetHeld() != 0 || h.GetDeclarationsRefused() != 0 {
		t.Errorf("holds after every room = %v; want none held, none refused", h)
	}
	t.Logf("engine file %d bytes checked byte for byte after each round; %s in all", len(e.mem), time.Since(start).Round(time.Millisecond))

	// The check can fail: one byte written through the agent into the
	// engine's V buffer of layer 2 (page 9, token 3, head 5, byte 7) is
	// found, and named, in the engine's own mapping.
	off := 9*gqa.engineItem(1) + (3*gqa.headsPerRank(1)+5)*gqa.headBytes() + 7
	was := e.mem[e.kvOff[1][2]+off]
	if _, err := c.xfer.WriteBuffer(ctxT(t), &transferv1.WriteBufferRequest{Name: "engine/dp0/tp0/v/2", Offset: uint64(off), Data: []byte{was ^ 0x5a}}); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("engine page 9 layer 2 V token 3 head 5 byte 7 = %#02x, want %#02x", was^0x5a, was)
	if err := e.check(); err == nil || err.Error() != want {
		t.Errorf("check after one byte changed = %v, want %q", err, want)
	}
}

// stamped is a room event and when the test received it.
type stamped struct {
	ev *pb.RoomEvent
	at time.Time
}

// watchRoom collects a room's events, each stamped, until its stream ends.
func (c *cluster) watchRoom(room uint64) <-chan stamped {
	t := c.t
	t.Helper()
	stream, err := c.rooms.WatchRoom(ctxT(t), &pb.WatchRoomRequest{Room: room})
	if err != nil {
		t.Fatalf("WatchRoom(%d): %v", room, err)
	}
	out := make(chan stamped, 64)
	go func() {
		defer close(out)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return
			}
			out <- stamped{ev, time.Now()}
		}
	}()
	return out
}

// next returns the first event of w for which pred holds.
func (c *cluster) next(w <-chan stamped, what string, pred func(*pb.RoomEvent) bool) stamped {
	c.t.Helper()
	for s := range w {
		c.t.Logf("event %v terminal=%v reusable=%v", s.ev.GetTransition(), s.ev.GetTerminal(), s.ev.GetPagesReusable())
		if pred(s.ev) {
			return s
		}
	}
	c.t.Fatalf("the room's watch ended without %s", what)
	return stamped{}
}

// declareHeld declares room's destination naming page held (and fresh
// pages and a row) and checks it is refused FAILED_PRECONDITION with
// ErrorInfo PAGE_HELD naming the holder (draining or not).
func (c *cluster) declareHeld(e *testEngine, room uint64, held int32, holder uint64, draining bool) {
	t := c.t
	t.Helper()
	pages, row := e.alloc(2)
	defer e.give(pages, row)
	_, err := c.rooms.DeclareDestination(ctxT(t), &pb.DeclareDestinationRequest{Room: room, PageIndices: append([]int32{held}, pages...), MetadataSlot: row})
	st := status.Convert(err)
	var info *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if i, ok := d.(*errdetails.ErrorInfo); ok {
			info = i
		}
	}
	if st.Code() != codes.FailedPrecondition || info.GetReason() != "PAGE_HELD" || info.GetMetadata()["holder"] != fmt.Sprint(holder) ||
		info.GetMetadata()["index"] != fmt.Sprint(held) || info.GetMetadata()["draining"] != fmt.Sprint(draining) ||
		!strings.Contains(st.Message(), fmt.Sprintf("page %d is still held by room %d", held, holder)) {
		t.Fatalf("DeclareDestination(room %d) naming page %d of room %d = %v (%v); want FailedPrecondition PAGE_HELD, holder %d, draining %v", room, held, holder, err, info, holder, draining)
	}
}

// TestE2EEngineLayoutAbortHeld: a room aborted while the agent holds one of
// its batches fails at once, but its pages are reusable only once nothing
// may write into them any more: after the held batch ended (the agent
// cannot recall it: it ends at its deadline, transfer.delegate.batch_timeout
// after it was submitted), or, for a prefill that writes by itself, after
// release.deferred_timeout. Until then a declaration naming one of its
// pages is refused FAILED_PRECONDITION PAGE_HELD naming the room; after
// it, accepted.
func TestE2EEngineLayoutAbortHeld(t *testing.T) {
	const batchTimeout, deferred = 3 * time.Second, 2 * time.Second
	const held, waiting, selfHeld, selfWaiting = 951, 952, 953, 954
	c, e, _ := newLayoutCluster(t, []string{"--fault-hold-rooms", fmt.Sprint(held), "--fault-hold-past-cancel"},
		"transfer.delegate.batch_timeout="+batchTimeout.String(), "release.deferred_timeout="+deferred.String())

	t.Run("held batch", func(t *testing.T) {
		c.t = t
		p := c.newLayoutPrefill("10.6.0.1:8998", 2)
		_, pages, _ := c.openDeclared(e, p, held, 100)
		p.fill(held, len(pages))
		c.openQueued(p, waiting)
		w := c.watchRoom(held)
		called := time.Now()
		done := make(chan error, 1)
		go func() {
			_, err := c.rooms.Transfer(ctxT(t), &pb.TransferRequest{Room: held, Rank: p.rank(0), NumPages: 3,
				Source: &pb.TransferSource{Buffer: p.prefix(0), PageIndices: []int32{p.srcPage(held, 0), p.srcPage(held, 1), p.srcPage(held, 2)}}})
			done <- err
		}()
		c.waitAgentLog("batch held", fmt.Sprintf("room=%d", held))
		aborted := time.Now()
		if resp, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: held}); err != nil || resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
			t.Fatalf("AbortRoom = %v, %v; want the room FAILED", resp, err)
		}
		end := c.next(w, "its terminal event", func(ev *pb.RoomEvent) bool { return ev.GetTerminal() })
		if end.ev.GetPagesReusable() || end.ev.GetRoom().GetFailure().GetCode() != pb.FailureCode_FAILURE_CODE_ABORTED || !end.at.Before(called.Add(batchTimeout)) {
			t.Fatalf("terminal event %v at +%s; want FAILED ABORTED, pages not reusable yet, before the held batch's deadline (+%s)", end.ev, end.at.Sub(aborted), batchTimeout)
		}
		c.declareHeld(e, waiting, pages[1], held, false)
		reusable := c.next(w, "pages reusable", func(ev *pb.RoomEvent) bool { return ev.GetPagesReusable() })
		if reusable.at.Before(called.Add(batchTimeout)) {
			t.Errorf("pages reusable %s after the Transfer call: before the held batch's deadline (%s)", reusable.at.Sub(called), batchTimeout)
		}
		if err := <-done; err == nil {
			t.Error("Transfer of the aborted room succeeded")
		}
		t.Logf("abort → FAILED event %s; Transfer call → pages reusable %s (held batch deadline %s)", end.at.Sub(aborted).Round(time.Millisecond),
			reusable.at.Sub(called).Round(time.Millisecond), batchTimeout)
		c.declareAfter(e, waiting, pages)
	})

	t.Run("prefill that writes by itself", func(t *testing.T) {
		c.t = t
		p := c.newLayoutPrefill("10.6.0.2:8998", 2)
		dests, pages, _ := c.openDeclared(e, p, selfHeld, 100)
		c.openQueued(p, selfWaiting)
		// Rank 1 moves and reports a chunk itself: its instance may write
		// into the destination until it acknowledges the room's end.
		if _, err := c.rooms.ReportTransfer(ctxT(t), &pb.ReportTransferRequest{Room: selfHeld, Rank: p.rank(1), NumPages: 3, Success: true,
			Bytes: 3 * dests[1].GetPageBytes()}); err != nil {
			t.Fatalf("ReportTransfer: %v", err)
		}
		w := c.watchRoom(selfHeld)
		aborted := time.Now()
		if _, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: selfHeld}); err != nil {
			t.Fatal(err)
		}
		end := c.next(w, "its terminal event", func(ev *pb.RoomEvent) bool { return ev.GetTerminal() })
		if end.ev.GetPagesReusable() || !end.at.Before(aborted.Add(deferred)) {
			t.Fatalf("terminal event %v at +%s; want FAILED, pages not reusable yet, before release.deferred_timeout", end.ev, end.at.Sub(aborted))
		}
		c.declareHeld(e, selfWaiting, pages[0], selfHeld, true)
		reusable := c.next(w, "pages reusable", func(ev *pb.RoomEvent) bool { return ev.GetPagesReusable() })
		if reusable.at.Before(aborted.Add(deferred)) {
			t.Errorf("pages reusable %s after the abort: before release.deferred_timeout (%s), with no acknowledgement", reusable.at.Sub(aborted), deferred)
		}
		t.Logf("abort → FAILED event %s; abort → pages reusable %s (release.deferred_timeout %s)", end.at.Sub(aborted).Round(time.Millisecond),
			reusable.at.Sub(aborted).Round(time.Millisecond), deferred)
		c.declareAfter(e, selfWaiting, pages)
	})
}

// openQueued opens a room that then waits for its declaration.
func (c *cluster) openQueued(p *layoutPrefill, room uint64) {
	t := c.t
	t.Helper()
	if _, err := c.rooms.OpenRoom(ctxT(t), &pb.OpenRoomRequest{Rid: fmt.Sprintf("req-%d", room), BootstrapAddr: p.addr, Room: room, PromptLen: 40, MaxNewTokens: 8}); err != nil {
		t.Fatalf("OpenRoom(%d): %v", room, err)
	}
	c.waitPhase(room, func(ph pb.RoomPhase) bool { return ph == pb.RoomPhase_ROOM_PHASE_QUEUED }, "queued for its declaration")
}

// declareAfter declares room into the first 3 of pages, which an earlier
// room held: accepted now; then aborts it (nobody claimed it: its pages are
// reusable at once) and gives the engine its pages back.
func (c *cluster) declareAfter(e *testEngine, room uint64, pages []int32) {
	t := c.t
	t.Helper()
	_, row := e.alloc(0)
	resp, err := c.rooms.DeclareDestination(ctxT(t), &pb.DeclareDestinationRequest{Room: room, PageIndices: pages[:3], MetadataSlot: row})
	if err != nil || resp.GetRoom().GetPhase() != pb.RoomPhase_ROOM_PHASE_ADMITTED {
		t.Fatalf("DeclareDestination(room %d) of pages reusable now = %v, %v; want ADMITTED", room, resp, err)
	}
	if _, err := c.rooms.AbortRoom(ctxT(t), &pb.AbortRoomRequest{Room: room}); err != nil {
		t.Fatal(err)
	}
	e.give(pages, row)
}

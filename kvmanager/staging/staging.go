package staging

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// Writer is one prefill rank's part of a region.
type Writer struct {
	Index     int
	PrefillTP int
	PrefillPP int
	// Slice is the head slice it carries (compute_head_slice_params).
	Slice HeadSlice
	// LayerBegin and LayerEnd are the model layers it carries.
	LayerBegin, LayerEnd int
	// BytesPerToken is Slice.NumHeads × head bytes × layers × 2.
	BytesPerToken int64
	// OffsetPerToken: the writer starts tokens × OffsetPerToken into the region.
	OffsetPerToken int64
}

// Target is one decode rank a prefill rank writes to.
type Target struct {
	DecodeTP            int
	Slice               HeadSlice
	Writer              Writer
	Writers             []Writer
	RegionBytesPerToken int64
}

// Pair is one (prefill TP rank, decode TP rank) pair.
type Pair struct {
	PrefillTP, DecodeTP int
	Slice               HeadSlice
}

// Watermark is one ring's state.
type Watermark struct {
	DecodeDP, DecodeTP int
	Round, Tail        int64
	HeadRound, Head    int64
	Live               int
	Size               int64
}

// RingInfo describes one decode rank's ring.
type RingInfo struct {
	DecodeDP, DecodeTP int
	Buffer             string
	Size               int64
	Watermark          Watermark
}

// Plan is one prefill rank's staging plan (SetupStaging's answer).
type Plan struct {
	Required                                 bool
	PrefillTP, DecodeTP, PrefillPP, DecodePP int
	TotalKVHeads, PageSize, NumLayers        int
	HeadBytes                                int64
	Pairs                                    []Pair
	Targets                                  []Target
	Rings                                    []RingInfo
	CompletionTimeout                        time.Duration
}

// Region is one allocated region as a writer sees it.
type Region struct {
	DecodeTP     int
	Buffer       string
	Region       RingRegion
	NumPages     int
	Writable     bool
	NumWriters   int
	WriterIndex  int
	WriterOffset int64
	WriterBytes  int64
	Existing     bool
}

// FieldError is a request field that contradicts a region already
// allocated or reported: the domain's one field error (kvlayout.Invalid),
// answered as an invalid argument naming Field.
type FieldError = kvlayout.Invalid

func fieldErr(field, format string, args ...any) error {
	return kvlayout.Invalidf(field, format, args...)
}

// TooLargeError is a chunk that needs more bytes than the whole ring: the
// room can never complete and its caller fails it with Msg. It wraps
// ErrTooLarge.
type TooLargeError struct{ Msg string }

func (e *TooLargeError) Error() string { return ErrTooLarge.Error() + ": " + e.Msg }

// Unwrap returns ErrTooLarge.
func (e *TooLargeError) Unwrap() error { return ErrTooLarge }

type ringKey struct{ dp, tp int }

type ring struct {
	key     ringKey
	ring    *Ring
	watches map[*Watch]struct{}
}

func (sr *ring) watermark() Watermark {
	r, t := sr.ring.Watermark()
	hr, h := sr.ring.Head()
	return Watermark{DecodeDP: sr.key.dp, DecodeTP: sr.key.tp, Round: r, Tail: t, HeadRound: hr, Head: h, Live: sr.ring.Live(), Size: sr.ring.Size()}
}

// notify tells the ring's watchers its new state; s.mu is held.
func (sr *ring) notify() {
	wm := sr.watermark()
	for w := range sr.watches {
		w.update(sr.key, wm)
	}
}

// Stager is the staging handler of one decode instance: the rings of every
// (decode DP shard, decode TP rank), made on first use, and the regions of
// the rooms it was given (Open). Its mutex is a leaf: it is taken after the
// caller's locks and nothing is called with it held. It never calls its
// caller back.
type Stager struct {
	layout    kvlayout.Layout
	ringBytes int64

	mu    sync.Mutex
	rings map[ringKey]*ring
}

// New returns the staging handler of a decode instance with layout l and
// ringBytes per decode rank (0: staging off).
func New(l kvlayout.Layout, ringBytes int64) *Stager {
	return &Stager{layout: l, ringBytes: ringBytes, rings: map[ringKey]*ring{}}
}

// RingBytes is the size of each ring.
func (s *Stager) RingBytes() int64 { return s.ringBytes }

// ringLocked returns the ring of (dp, tp), made on first use.
func (s *Stager) ringLocked(dp, tp int) *ring {
	k := ringKey{dp, tp}
	sr := s.rings[k]
	if sr == nil {
		sr = &ring{key: k, ring: NewRing(s.ringBytes), watches: map[*Watch]struct{}{}}
		s.rings[k] = sr
	}
	return sr
}

// RingInfo describes the ring of (dp, tp).
func (s *Stager) RingInfo(dp, tp int) RingInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.ringLocked(dp, tp)
	return RingInfo{DecodeDP: dp, DecodeTP: tp, Buffer: kvcopy.StagingName(dp, tp), Size: sr.ring.Size(), Watermark: sr.watermark()}
}

// Stage is the decode PP stage a prefill PP rank writes to (prefillPP
// stages in all).
func (s *Stager) Stage(prefillPP, ppRank int) int {
	if s.layout.PP == prefillPP {
		return ppRank
	}
	return 0
}

// Writers lists the writers of decode rank e's regions for decode PP stage
// q, in order (pp stage, tp writer), with their per-token layout, for a
// prefill of attention TP prefillTP and PP prefillPP and heads KV heads in
// all.
func (s *Stager) Writers(prefillTP, prefillPP, heads, e, q int) []Writer {
	P, D := prefillTP, s.layout.AttnTP
	var tps []int
	if P > D {
		k := P / D
		for t := e * k; t < (e+1)*k; t++ {
			tps = append(tps, t)
		}
	} else {
		tps = []int{e / max(1, D/P)}
	}
	stages := []int{q}
	if s.layout.PP != prefillPP {
		stages = nil
		for st := range prefillPP {
			stages = append(stages, st)
		}
	}
	var out []Writer
	var off int64
	for _, st := range stages {
		b, end := transfer.StageLayers(s.layout.NumLayers, prefillPP, st)
		for _, t := range tps {
			hs := transfer.ComputeHeadSliceParams(P, D, t, e, heads)
			w := Writer{Index: len(out), PrefillTP: t, PrefillPP: st, Slice: hs, LayerBegin: b, LayerEnd: end,
				BytesPerToken: int64(hs.NumHeads) * s.layout.HeadBytes() * int64(end-b) * 2, OffsetPerToken: off}
			off += w.BytesPerToken
			out = append(out, w)
		}
	}
	return out
}

// Room is the staging state of one attempt of one staged room: its regions
// by (chunk, decode TP rank, decode PP stage). The Stager's mutex guards it;
// its owner keeps the handle and gives it back to the Stager's methods.
type Room struct {
	id        uint64
	attempt   uint32
	prefillTP int
	prefillPP int
	chunks    map[stagedKey]*Staged
	pending   int // regions allocated and not yet freed
}

// Attempt is the room attempt the state was opened for.
func (rm *Room) Attempt() uint32 { return rm.attempt }

// Stage is the decode PP stage prefill PP rank ppRank of rm's prefill
// writes to.
func (rm *Room) Stage(s *Stager, ppRank int) int { return s.Stage(rm.prefillPP, ppRank) }

// stagedKey is one region: (chunk, decode TP rank, decode PP stage).
type stagedKey struct{ chunk, tp, pp int }

type scatterState uint8

const (
	scatterIdle scatterState = iota
	scatterRunning
	scatterDone
)

// Staged is one allocated region of a room: its writers and which of them
// reported, and its scatter. The Stager's mutex guards it.
type Staged struct {
	key        stagedKey
	ring       *ring
	region     RingRegion
	numPages   int
	pageOffset int // -1 until the first writer reported
	writers    []Writer
	arrived    []bool
	nArrived   int
	aux        []*chunkAux
	state      scatterState
	running    chan struct{} // closed when the scatter in flight returns
	freed      bool
}

// Chunk is the chunk index of the region.
func (sc *Staged) Chunk() int { return sc.key.chunk }

type chunkAux struct {
	marker    uint64
	outputIDs []int32
}

// Open starts the staging state of attempt of room id, whose prefill has
// attention TP prefillTP and PP prefillPP.
func (s *Stager) Open(id uint64, attempt uint32, prefillTP, prefillPP int) *Room {
	return &Room{id: id, attempt: attempt, prefillTP: prefillTP, prefillPP: prefillPP, chunks: map[stagedKey]*Staged{}}
}

// Freed is a region Release gave back to its ring before it was scattered.
type Freed struct {
	Chunk, DecodeTP int
	Region          RingRegion
}

// Release frees every region of rm not freed yet (SGLang's
// unregister_decode_req) and returns them. Its caller ensures that no
// scatter of the room is in flight and that no write the daemon runs can
// still land in them. A region is freed once: a later Release or scatter end
// finds it freed.
func (s *Stager) Release(rm *Room) []Freed {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Freed
	touched := map[*ring]bool{}
	for _, sc := range rm.chunks {
		if sc.freed {
			continue
		}
		out = append(out, Freed{Chunk: sc.key.chunk, DecodeTP: sc.key.tp, Region: sc.region})
		s.freeLocked(rm, sc, false)
		touched[sc.ring] = true
	}
	for sr := range touched {
		sr.notify()
	}
	return out
}

// freeLocked gives sc back to its ring, once.
func (s *Stager) freeLocked(rm *Room, sc *Staged, notify bool) {
	if sc.freed {
		return
	}
	sc.ring.ring.Free(sc.region.ID)
	sc.freed = true
	rm.pending--
	if notify {
		sc.ring.notify()
	}
}

// Pending counts rm's regions allocated and not freed yet.
func (s *Stager) Pending(rm *Room) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return rm.pending
}

// ScattersDue reports whether a region of rm that every writer reported is
// still to be scattered.
func (s *Stager) ScattersDue(rm *Room) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range rm.chunks {
		if !sc.freed && sc.state != scatterDone && sc.nArrived == len(sc.writers) {
			return true
		}
	}
	return false
}

// Missing describes rm's regions not freed yet, sorted: "chunk C -> decode
// tp T (arrived/writers writers)".
func (s *Stager) Missing(rm *Room) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var missing []string
	for _, sc := range rm.chunks {
		if !sc.freed {
			missing = append(missing, fmt.Sprintf("chunk %d -> decode tp %d (%d/%d writers)", sc.key.chunk, sc.key.tp, sc.nArrived, len(sc.writers)))
		}
	}
	sort.Strings(missing)
	return missing
}

// Alloc asks for one chunk's region on one decode rank on behalf of one
// writer.
type Alloc struct {
	DecodeDP, DecodeTP, Stage int
	Chunk, NumPages           int
	// Heads is the model's number of KV heads.
	Heads int
	// WriterTP and WriterPP are the asking prefill rank.
	WriterTP, WriterPP int
}

// Allocate returns the region of a chunk on one decode rank, allocating it
// from the ring of (DecodeDP, DecodeTP) when no writer asked for it before
// (SGLang's handle_staging_req). A chunk larger than the ring is a
// *TooLargeError (the room can never complete); a page count other than the
// region's is a *FieldError for num_pages.
func (s *Stager) Allocate(rm *Room, a Alloc) (Region, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := stagedKey{chunk: a.Chunk, tp: a.DecodeTP, pp: a.Stage}
	tokens := a.NumPages * s.layout.PageSize
	sc := rm.chunks[key]
	existing := sc != nil
	if existing && sc.numPages != a.NumPages {
		return Region{}, fieldErr("num_pages", "%d differs from the %d pages chunk %d's region on decode rank %d was allocated with", a.NumPages, sc.numPages, a.Chunk, a.DecodeTP)
	}
	if !existing {
		ws := s.Writers(rm.prefillTP, rm.prefillPP, a.Heads, a.DecodeTP, a.Stage)
		var perToken int64
		for _, w := range ws {
			perToken += w.BytesPerToken
		}
		sr := s.ringLocked(a.DecodeDP, a.DecodeTP)
		reg, err := sr.ring.Assign(int64(tokens) * perToken)
		if err != nil {
			return Region{}, &TooLargeError{Msg: fmt.Sprintf("Staging chunk %d of room %d (%d pages, %d bytes for decode rank dp %d tp %d) exceeds the staging ring (%d bytes): %s",
				a.Chunk, rm.id, a.NumPages, int64(tokens)*perToken, a.DecodeDP, a.DecodeTP, sr.ring.Size(), Hint)}
		}
		sc = &Staged{key: key, ring: sr, region: reg, numPages: a.NumPages, pageOffset: -1, writers: ws,
			arrived: make([]bool, len(ws)), aux: make([]*chunkAux, len(ws))}
		rm.chunks[key] = sc
		rm.pending++
		sr.notify()
	}
	out := Region{DecodeTP: a.DecodeTP, Buffer: kvcopy.StagingName(a.DecodeDP, a.DecodeTP), Region: sc.region,
		NumPages: a.NumPages, Writable: !sc.freed && sc.ring.ring.Writable(sc.region), NumWriters: len(sc.writers), Existing: existing}
	for _, w := range sc.writers {
		if w.PrefillTP == a.WriterTP && w.PrefillPP == a.WriterPP {
			out.WriterIndex, out.WriterOffset, out.WriterBytes = w.Index, int64(tokens)*w.OffsetPerToken, int64(tokens)*w.BytesPerToken
		}
	}
	return out, nil
}

// Lookup returns rm's region of chunk on decode rank tp, stage, or nil when
// none is allocated.
func (s *Stager) Lookup(rm *Room, chunk, tp, stage int) *Staged {
	s.mu.Lock()
	defer s.mu.Unlock()
	return rm.chunks[stagedKey{chunk: chunk, tp: tp, pp: stage}]
}

// Report is one writer's report of its part of a region.
type Report struct {
	DecodeDP             int
	NumPages, PageOffset int
	WriterTP, WriterPP   int
}

// Check validates a writer's report of sc and returns its writer index, or
// -1 when the rank is not one of the region's writers. A page count or a
// page offset that contradicts the region is a *FieldError; a region the
// watermark has not released wraps ErrNotWritable. Nothing is recorded.
func (s *Stager) Check(rm *Room, sc *Staged, rep Report) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sc.numPages != rep.NumPages {
		return -1, fieldErr("num_pages", "%d differs from the region's %d pages (chunk %d, decode rank %d)", rep.NumPages, sc.numPages, sc.key.chunk, sc.key.tp)
	}
	if sc.pageOffset >= 0 && sc.pageOffset != rep.PageOffset {
		return -1, fieldErr("page_offset", "%d differs from %d reported by another writer of chunk %d (decode rank %d)", rep.PageOffset, sc.pageOffset, sc.key.chunk, sc.key.tp)
	}
	if !sc.ring.ring.Writable(sc.region) {
		wr, wt := sc.ring.ring.Watermark()
		return -1, fmt.Errorf("chunk %d of room %d: %w: region [%d, %d) of round %d on decode rank dp %d tp %d is released only when the watermark passes it (now round %d, tail %d); wait for WatchWatermark, write it, then report it",
			sc.key.chunk, rm.id, ErrNotWritable, sc.region.Offset, sc.region.End(), sc.region.Round, rep.DecodeDP, sc.key.tp, wr, wt)
	}
	wi := -1
	for _, w := range sc.writers {
		if w.PrefillTP == rep.WriterTP && w.PrefillPP == rep.WriterPP {
			wi = w.Index
		}
	}
	return wi, nil
}

// Arrive records that writer (an index Check returned) wrote its part of sc
// at pageOffset; marker (0: none) and outputIDs are its metadata. It returns
// the bytes the writer wrote.
func (s *Stager) Arrive(sc *Staged, writer, pageOffset int, marker uint64, outputIDs []int32) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	sc.pageOffset = pageOffset
	sc.arrived[writer] = true
	sc.nArrived++
	if marker != 0 || len(outputIDs) > 0 {
		sc.aux[writer] = &chunkAux{marker: marker, outputIDs: slices.Clone(outputIDs)}
	}
	return int64(sc.numPages*s.layout.PageSize) * sc.writers[writer].BytesPerToken
}

// Arrived counts sc's writers that reported, and its writers.
func (s *Stager) Arrived(sc *Staged) (arrived, writers int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return sc.nArrived, len(sc.writers)
}

// Ready lists rm's regions of chunk for stage on the decode ranks tps whose
// writers have all reported and whose scatter has not landed.
func (s *Stager) Ready(rm *Room, chunk, stage int, tps []int) []*Staged {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*Staged
	for _, tp := range tps {
		sc := rm.chunks[stagedKey{chunk: chunk, tp: tp, pp: stage}]
		if sc != nil && sc.nArrived == len(sc.writers) && sc.state != scatterDone {
			out = append(out, sc)
		}
	}
	return out
}

// Scattering reports sc's scatter: a scatter in flight (wait is closed when
// it returns), landed (done), or neither (the caller may start one).
func (s *Stager) Scattering(sc *Staged) (wait <-chan struct{}, done bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch sc.state {
	case scatterRunning:
		return sc.running, false
	case scatterDone:
		return nil, true
	}
	return nil, false
}

// Scatter is what a scatter of one region moves: the region's bytes in its
// ring, its writers, and its pages [PageOffset, PageOffset+NumPages) of
// the destination.
type Scatter struct {
	Chunk, DecodeTP      int
	Region               RingRegion
	Tokens               int // NumPages × page size: the token rows per block
	PageOffset, NumPages int
	Writers              []Writer
	// Marker (0: none) and OutputIDs are the metadata a writer reported.
	Marker    uint64
	OutputIDs []int32
}

// StartScatter marks sc's scatter in flight and returns what it moves. The
// caller runs it and then calls EndScatter, exactly once.
func (s *Stager) StartScatter(sc *Staged) Scatter {
	s.mu.Lock()
	defer s.mu.Unlock()
	op := Scatter{Chunk: sc.key.chunk, DecodeTP: sc.key.tp, Region: sc.region, Tokens: sc.numPages * s.layout.PageSize,
		PageOffset: sc.pageOffset, NumPages: sc.numPages, Writers: sc.writers}
	for _, a := range sc.aux {
		if a != nil {
			op.Marker, op.OutputIDs = a.marker, a.outputIDs
			break
		}
	}
	sc.state, sc.running = scatterRunning, make(chan struct{})
	return op
}

// EndScatter records that sc's scatter returned. With free, the scatter is
// over (it landed, or it failed for good, or the room ended): the region
// goes back to its ring unless it already did, and the watermark advances.
// Without free nothing landed and a later report may start it again; the
// region stays allocated.
func (s *Stager) EndScatter(rm *Room, sc *Staged, free bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(sc.running)
	if !free {
		sc.state = scatterIdle
		return
	}
	sc.state = scatterDone
	s.freeLocked(rm, sc, true)
}

// Watch streams the watermarks of some rings (WatchWatermark). Updates
// coalesce: Next returns the latest state of every ring that changed.
type Watch struct {
	s      *Stager
	rings  []*ring
	notify chan struct{}
	latest map[ringKey]Watermark // guarded by s.mu
	closed bool
}

// Watch watches the rings of decode DP shard dp and TP ranks tps (the
// caller checked they exist). The first Next returns every ring's current
// state.
func (s *Stager) Watch(dp int, tps []int) *Watch {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &Watch{s: s, notify: make(chan struct{}, 1), latest: map[ringKey]Watermark{}}
	for _, tp := range tps {
		sr := s.ringLocked(dp, tp)
		if slices.Contains(w.rings, sr) {
			continue
		}
		w.rings = append(w.rings, sr)
		sr.watches[w] = struct{}{}
		w.update(sr.key, sr.watermark())
	}
	return w
}

// update records a ring's state and wakes Next; called with s.mu held.
func (w *Watch) update(k ringKey, wm Watermark) {
	w.latest[k] = wm
	select {
	case w.notify <- struct{}{}:
	default: // a wake-up is already pending; Next reads the latest state
	}
}

// Next waits for changes and returns the latest state of every changed ring,
// ordered by TP rank.
func (w *Watch) Next(ctx context.Context) ([]Watermark, error) {
	for {
		select {
		case <-w.notify:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		w.s.mu.Lock()
		if w.closed {
			w.s.mu.Unlock()
			return nil, errors.New("watermark watch closed")
		}
		out := make([]Watermark, 0, len(w.latest))
		for _, wm := range w.latest {
			out = append(out, wm)
		}
		clear(w.latest)
		w.s.mu.Unlock()
		if len(out) == 0 {
			continue
		}
		sort.Slice(out, func(i, j int) bool { return out[i].DecodeTP < out[j].DecodeTP })
		return out, nil
	}
}

// Close stops the watch.
func (w *Watch) Close() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.closed = true
	for _, sr := range w.rings {
		delete(sr.watches, w)
	}
}

// Watermarks returns the state of every decode rank's ring, ordered by
// (DP, TP): rings not used yet are reported empty. None when staging is off.
func (s *Stager) Watermarks() []Watermark {
	if s.ringBytes <= 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Watermark, 0, s.layout.DP*s.layout.AttnTP)
	for dp := range s.layout.DP {
		for tp := range s.layout.AttnTP {
			if sr := s.rings[ringKey{dp, tp}]; sr != nil {
				out = append(out, sr.watermark())
			} else {
				out = append(out, Watermark{DecodeDP: dp, DecodeTP: tp, Size: s.ringBytes})
			}
		}
	}
	return out
}

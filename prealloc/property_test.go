package prealloc

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// The property test drives random operation sequences against a ledger and
// an independent shadow model. After every operation it checks
// CheckInvariants, that the ledger's stats equal the shadow's (per-state
// counts, pages, SWA pages, slots, retractable tokens), and that every
// operation's outcome is the one the shadow predicts. Admission passes are
// predicted by a straightforward scan-based re-statement of SGLang's
// resume_retracted_reqs / pop_preallocated (no heaps, no incremental sums),
// with decodeplane's two departures: a room retracted since the last decode
// step report waits for it, and admission.max_bypass lets later rooms past
// one that does not fit.
// Every run ends by releasing every room and checking the ledger is full.

// propertyOps is the exact number of random operations the deterministic
// run performs in a plain `go test` (spread over propertyConfigs).
const propertyOps = 120_000

// source yields random choices; the seeded run uses PCG, the fuzz target
// the fuzzer's bytes.
type source interface {
	intn(n int) int
	done() bool
}

type pcgSource struct{ r *rand.Rand }

func (s pcgSource) intn(n int) int { return s.r.IntN(n) }
func (s pcgSource) done() bool     { return false }

type byteSource struct {
	b []byte
	i int
}

func (s *byteSource) intn(n int) int {
	if s.i >= len(s.b) {
		s.i++
		return 0
	}
	v := int(s.b[s.i])
	s.i++
	if n > 256 && s.i < len(s.b) {
		v = v<<8 | int(s.b[s.i])
		s.i++
	}
	return v % n
}
func (s *byteSource) done() bool { return s.i >= len(s.b) }

// propertyConfigs are the pools the property test runs on: small, so that
// shortages of every kind are frequent.
func propertyConfigs() []propertyConfig {
	gqa := testConfig(kvlayout.KindGQA, 16, 256, 4)
	gqa.Pool.PreAllocSlots = -1            // 4 ≤ 32 ⇒ 8 extra rows
	gqa.Admission.ReservedDecodeTokens = 0 // R = 0 is covered here
	gqa.Admission.ClipMaxNewTokens = 512
	gqa.Admission.ClaimTimeout = 5 * time.Second
	gqa.Admission.MaxBypass = 2

	low := testConfig(kvlayout.KindMLA, 32, 128, 6)
	low.Admission.ReservedDecodeTokens = 32
	low.Admission.ClipMaxNewTokens = 256
	low.Admission.Priority = kvlayout.PriorityLowFirst
	low.Admission.MaxQueued = 12

	high := testConfig(kvlayout.KindHybridMLA, 8, 512, 10)
	high.Admission.ReservedDecodeTokens = 16
	high.Admission.ClipMaxNewTokens = 300
	high.Admission.Priority = kvlayout.PriorityHighFirst
	high.Admission.ClaimTimeout = time.Second
	high.Admission.MaxBypass = 5

	swaTail := testConfig(kvlayout.KindHybridSWA, 16, 256, 8)
	swaTail.Pool.SWA = kvlayout.SWAConfig{Window: 64, TotalTokens: 640}
	swaTail.Admission.ReservedDecodeTokens = 32
	swaTail.Admission.ClipMaxNewTokens = 200
	swaTail.Admission.ClaimTimeout = 3 * time.Second
	swaTail.Admission.MaxBypass = 3

	swaMirror := testConfig(kvlayout.KindHybridSWA, 1, 1200, 6)
	swaMirror.Pool.SWA = kvlayout.SWAConfig{Window: 96, TotalTokens: 1024}
	swaMirror.Admission.ReservedDecodeTokens = 24
	swaMirror.Admission.ClipMaxNewTokens = 128

	mamba := testConfig(kvlayout.KindHybridLinear, 8, 384, 6)
	mamba.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 14, ExtraBuffer: true, PingPong: 2}
	mamba.Admission.ReservedDecodeTokens = 48
	mamba.Admission.ClipMaxNewTokens = 256

	metaShort := testConfig(kvlayout.KindGQA, 4, 512, 8)
	metaShort.Pool.MetadataSlots = 3
	metaShort.Admission.ReservedDecodeTokens = 24
	metaShort.Admission.ClipMaxNewTokens = 64
	metaShort.Admission.ClaimTimeout = 2 * time.Second

	page1 := testConfig(kvlayout.KindGQA, 1, 1500, 5)
	page1.Admission.ReservedDecodeTokens = 40
	page1.Admission.ClipMaxNewTokens = 100
	page1.Admission.Priority = kvlayout.PriorityLowFirst
	page1.Admission.MaxBypass = 1

	return []propertyConfig{
		// R = 0: a retracted room fits again unless others grew meanwhile, so
		// BlockRetracted is not required here.
		{"gqa-fifo-deadlines-bypass", gqa, false, []string{"block: req_slots", "claim timeout: room", "admit: bypassed", "block: bypass exhausted"}},
		{"mla-low-first-max-queued", low, false, []string{"block: req_slots", "block: retracted", "enqueue: admission queue is full"}},
		{"dsa-high-first-bypass", high, false, []string{"block: req_slots", "block: retracted", "claim timeout: room", "admit: bypassed", "block: bypass exhausted"}},
		{"swa-tail-bypass", swaTail, false, []string{"block: swa", "block: retracted", "update: swa evicted", "claim timeout: room", "admit: bypassed", "block: bypass exhausted"}},
		{"swa-mirror-page1", swaMirror, false, []string{"block: retracted", "update: swa evicted"}},
		// 14 Mamba slots < 6 rows × 3: Mamba shortages come before req slots.
		{"mamba-pingpong-short", mamba, true, []string{"block: mamba", "block: retracted"}},
		// 3 metadata slots < 8 rows: metadata shortages.
		{"metadata-short", metaShort, true, []string{"block: metadata_slots", "block: retracted", "claim timeout: room"}},
		{"page1-low-first-bypass", page1, false, []string{"block: req_slots", "block: retracted", "admit: bypassed", "block: bypass exhausted"}},
	}
}

// propertyConfig is one pool of the property test and the outcomes its
// deterministic run must produce besides the common ones.
type propertyConfig struct {
	name        string
	cfg         kvlayout.Config
	unvalidated bool
	expect      []string
}

// TestPropertySeeded is the deterministic run of exactly propertyOps
// operations.
func TestPropertySeeded(t *testing.T) {
	cfgs := propertyConfigs()
	per := propertyOps / len(cfgs)
	total := 0
	for i, c := range cfgs {
		ops := per
		if i == len(cfgs)-1 {
			ops = propertyOps - total
		}
		total += ops
		t.Run(c.name, func(t *testing.T) {
			src := pcgSource{rand.New(rand.NewPCG(0x5eed, uint64(i)+1))}
			n, seen := runSim(t, c.cfg, c.unvalidated, src, ops)
			if n != ops {
				t.Fatalf("ran %d operations, want %d", n, ops)
			}
			// The run must exercise every path, or it proves little.
			must := []string{
				"admit: new", "admit: resumed", "block: none", "block: tokens",
				"update: grew", "update: no free KV pages", "resume held: room", "enqueue: capacity",
				"release: room not in the ledger", "set ready: operation not valid in the room's ledger state",
				"update: invalid request", "enqueue: room already in the ledger", "enqueue: ledger is draining",
				"resume: waits for a decode step",
				"drain: room", "drain: again", "drain: operation not valid in the room's ledger state",
				"release: draining", "adopt: room", "adopt: already held by another room", "adopt: invalid request",
				"adopt: room already in the ledger",
			}
			for _, k := range append(must, c.expect...) {
				if seen[k] == 0 {
					t.Errorf("the run never produced %q", k)
				}
			}
			t.Logf("%d ops: %v", n, seen)
		})
	}
	if total != propertyOps {
		t.Fatalf("planned %d operations, want %d", total, propertyOps)
	}
}

// TestPropertyManySeeds runs shorter sequences from many seeds on every
// pool, so that the invariants (draining and adopted rooms included) are
// checked from many starting points, not one stream per pool.
func TestPropertyManySeeds(t *testing.T) {
	const seeds, ops = 16, 600
	for i, c := range propertyConfigs() {
		t.Run(c.name, func(t *testing.T) {
			seen := map[string]int{}
			for seed := uint64(1); seed <= seeds; seed++ {
				src := pcgSource{rand.New(rand.NewPCG(seed<<8|uint64(i), 0xd7a1))}
				_, got := runSim(t, c.cfg, c.unvalidated, src, ops)
				for k, v := range got {
					seen[k] += v
				}
			}
			for _, k := range []string{"drain: room", "release: draining", "adopt: room", "adopt: already held by another room"} {
				if seen[k] == 0 {
					t.Errorf("%d seeds never produced %q", seeds, k)
				}
			}
		})
	}
}

// FuzzLedger drives the same checks from fuzzer bytes: the first byte picks
// the configuration, the rest the operations.
func FuzzLedger(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{3, 0, 40, 0, 50, 1, 2, 2, 7, 3, 9, 5, 5, 5, 6, 6, 1, 0, 0})
	f.Add([]byte{5, 0, 200, 1, 1, 2, 2, 3, 3, 4, 4, 7, 7, 8, 8, 9, 9})
	f.Add([]byte{4, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 6, 6, 6, 10, 10, 12, 13})
	cfgs := propertyConfigs()
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		c := cfgs[int(data[0])%len(cfgs)]
		src := &byteSource{b: data[1:]}
		runSim(t, c.cfg, c.unvalidated, src, len(data))
	})
}

// ---- shadow model ----

type shadowRoom struct {
	id       uint64
	req      Request
	state    RoomState
	seq      uint64
	fill     int64 // fill of the current allocation
	pages    int   // full pages held
	swaFirst int   // first live SWA page (sequence page index)
	meta     bool
	retStep  uint64 // sim.steps when retracted
	bypassed int    // rooms admitted ahead of it while it did not fit
}

type sim struct {
	t   testing.TB
	src source
	cfg kvlayout.Config
	uv  bool
	l   *Ledger

	page, reserve, clip, window int64
	swa                         swaMode
	spr                         int
	maxTotal, swaCap            int64
	order                       queueOrder
	maxQueued                   int
	maxBypass                   int
	timeout                     time.Duration
	totalPages, totalSWA        int

	rooms     map[uint64]*shadowRoom
	retracted []uint64
	held      []uint64
	nextID    uint64
	nextSeq   uint64
	draining  bool
	steps     uint64 // accepted UpdateRunning calls (decode-step reports)

	seen map[string]int // outcome coverage, checked by the seeded run
}

func newSim(t testing.TB, cfg kvlayout.Config, unvalidated bool, src source) *sim {
	s := &sim{t: t, src: src, cfg: cfg, uv: unvalidated, seen: map[string]int{}}
	p, a := cfg.Pool, cfg.Admission
	s.page = int64(p.PageSize)
	s.reserve = int64(a.ReservedDecodeTokens)
	s.clip = int64(a.ClipMaxNewTokens)
	s.totalPages = int(p.Pages())
	s.maxTotal = p.Pages() * s.page
	if p.Kind == kvlayout.KindHybridSWA {
		s.window = int64(p.SWA.Window)
		s.totalSWA = int(p.SWA.TotalTokens / s.page)
		s.swaCap = int64(s.totalSWA) * s.page
		if s.page > 1 {
			s.swa = swaTail
		} else {
			s.swa = swaMirror
			s.maxTotal = min(s.maxTotal, s.swaCap)
		}
	}
	if p.Kind == kvlayout.KindHybridLinear {
		s.spr = p.Mamba.MambaSlotsPerReq()
	}
	switch a.Priority {
	case kvlayout.PriorityLowFirst:
		s.order = orderLowFirst
	case kvlayout.PriorityHighFirst:
		s.order = orderHighFirst
	}
	s.maxQueued = a.MaxQueued
	if s.maxQueued == 0 {
		s.maxQueued = defaultMaxQueued
	}
	s.timeout = a.ClaimTimeout // the room manager's claim timeout: opClaimTimeout runs only with one
	s.maxBypass = a.MaxBypass
	s.reset()
	return s
}

func (s *sim) reset() {
	s.l = newLedger(s.t, s.cfg, s.uv)
	s.rooms = map[uint64]*shadowRoom{}
	s.retracted, s.held = nil, nil
	s.draining = false
}

func (s *sim) fatalf(format string, args ...any) {
	s.t.Helper()
	s.t.Fatalf(format, args...)
}

func (s *sim) fill(r Request) int64 {
	if r.Rebootstrap {
		return int64(r.PromptLen) + int64(r.OutputLen)
	}
	return int64(r.PromptLen) + int64(max(r.OutputLen-1, 0))
}

func (s *sim) origin(r Request) int64 {
	if r.Rebootstrap {
		return int64(r.PromptLen) + int64(r.OutputLen)
	}
	return int64(r.PromptLen)
}

func (s *sim) tail(seq int64) int64 {
	if s.swa != swaTail || seq <= 0 {
		return max(seq, 0)
	}
	return seq - max(0, seq-s.window)/s.page*s.page
}

func (s *sim) firstSWAPage(fill int64) int {
	if s.swa != swaTail {
		return 0
	}
	return int(max(0, fill-s.window) / s.page)
}

func (s *sim) pagesFor(n int64) int { return int((n + s.page - 1) / s.page) }

// fits is the entry check: SGLang's (origin_len, SWA tail) and the
// admission test on an empty pool (every page free, nothing active or
// running), which a request must pass to be admissible at all.
func (s *sim) fits(r Request) bool {
	f, o := s.fill(r), s.origin(r)
	mn := min(int64(r.MaxNewTokens), s.clip)
	if o > s.maxTotal || int64(s.pagesFor(f))*s.page+s.reserve > s.maxTotal || o+mn > s.maxTotal {
		return false
	}
	if s.swa != swaTail {
		return true
	}
	swaPages := s.pagesFor(f) - s.firstSWAPage(f)
	return s.tail(f)+mn <= s.swaCap && int64(swaPages)*s.page <= s.swaCap
}

// resumable: a running request's retracted requirement fits an empty
// shard (fill_len + R, its SWA tail, its SWA pages).
func (s *sim) resumable(r Request) bool {
	f := s.fill(r)
	if f+s.reserve > s.maxTotal {
		return false
	}
	if s.swa == swaNone {
		return true
	}
	return (s.swa != swaTail || s.tail(f) <= s.swaCap) && s.pagesFor(f)-s.firstSWAPage(f) <= s.totalSWA
}

func (s *sim) holds(r *shadowRoom) bool { return r.state.holdsAllocation() }

// tally counts the shadow rooms per state in one pass.
func (s *sim) tally() (c [numRoomStates]int) {
	for _, r := range s.rooms {
		c[r.state]++
	}
	return c
}

func (s *sim) active() int64 {
	c := s.tally()
	return int64(c[RoomAdmitted] + c[RoomClaimed] + c[RoomResumed] + c[RoomRunning])
}

// unknownRoomBase starts a range of room ids the simulation never enqueues.
const unknownRoomBase = 1 << 62

// pick returns a random shadow room (sorted ids for determinism), or a
// fresh unknown id now and then.
func (s *sim) pick(filter func(*shadowRoom) bool) (uint64, *shadowRoom) {
	all := make([]uint64, 0, len(s.rooms))
	for id := range s.rooms {
		all = append(all, id)
	}
	slices.Sort(all) // the filter may consume randomness: fixed order
	ids := all[:0]
	for _, id := range all {
		if filter == nil || filter(s.rooms[id]) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 || s.src.intn(20) == 0 {
		return unknownRoomBase + uint64(s.src.intn(5)), nil // never enqueued
	}
	id := ids[s.src.intn(len(ids))]
	return id, s.rooms[id]
}

// ---- operations ----

func runSim(t testing.TB, cfg kvlayout.Config, unvalidated bool, src source, ops int) (int, map[string]int) {
	s := newSim(t, cfg, unvalidated, src)
	n := 0
	for ; n < ops && !src.done(); n++ {
		s.step(n)
		s.check(n)
	}
	s.releaseAll()
	return n, s.seen
}

func (s *sim) step(n int) {
	switch op := s.src.intn(108); {
	case op >= 104:
		s.opAdopt()
	case op >= 100:
		s.opDrain()
	case op < 18:
		s.opEnqueue()
	case op < 31:
		s.opSetReady()
	case op < 45:
		s.opAdmit()
	case op < 52:
		s.opClaim()
	case op < 61:
		s.opStart()
	case op < 75:
		s.opUpdate()
	case op < 79:
		s.opRetract()
	case op < 81:
		s.opHold()
	case op < 83:
		s.opResumeHeld()
	case op < 91:
		s.opRelease()
	case op < 98:
		s.opClaimTimeout()
	case op < 99:
		if s.src.intn(10) == 0 {
			s.l.Drain()
			s.draining = true
		}
	default:
		if s.draining || s.src.intn(30) == 0 {
			// Release everything, check full, start over.
			s.releaseAll()
			s.reset()
		}
	}
}

func (s *sim) opEnqueue() {
	r := Request{
		Room:         s.nextID + 1,
		RID:          fmt.Sprintf("r%d", s.nextID+1),
		PromptLen:    s.src.intn(int(s.maxTotal/24) + 1),
		MaxNewTokens: s.src.intn(int(s.clip) * 2),
		Priority:     s.src.intn(4),
	}
	switch s.src.intn(12) {
	case 0:
		r.PromptLen = int(s.maxTotal) + s.src.intn(3) - 1 // around the capacity
	case 4, 5, 6:
		r.PromptLen = s.src.intn(int(s.maxTotal/3) + 1) // large
	case 1:
		r.OutputLen = s.src.intn(20)
	case 2:
		r.OutputLen = s.src.intn(20)
		r.Rebootstrap = true
	case 3:
		if id, old := s.pick(nil); old != nil {
			r.Room = id // duplicate id
		}
	}
	err := s.l.Enqueue(r)
	_, exists := s.rooms[r.Room]
	c := s.tally()
	queued := c[RoomWaiting] + c[RoomReady]
	switch {
	case s.draining:
		s.expectErr("enqueue", err, ErrDraining)
	case exists:
		s.expectErr("enqueue", err, errRoomExists)
	case !s.fits(r):
		var ce *CapacityError
		if !errors.As(err, &ce) || ce.RID != r.RID {
			s.fatalf("enqueue %+v: got %v, want a capacity error", r, err)
		}
		s.seen["enqueue: capacity"]++
	case queued >= s.maxQueued:
		s.expectErr("enqueue", err, ErrQueueFull)
	default:
		if err != nil {
			s.fatalf("enqueue %+v: %v", r, err)
		}
		s.rooms[r.Room] = &shadowRoom{id: r.Room, req: r, state: RoomWaiting, seq: s.nextSeq}
		s.nextSeq++
	}
	s.nextID = max(s.nextID, r.Room)
}

func (s *sim) expectErr(op string, err, want error) {
	s.t.Helper()
	if !errors.Is(err, want) {
		s.fatalf("%s: got %v, want %v", op, err, want)
	}
	s.seen[op+": "+want.Error()]++
}

func (s *sim) opSetReady() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomWaiting || s.src.intn(12) == 0 })
	err := s.l.SetReady(id)
	switch {
	case r == nil:
		s.expectErr("set ready", err, errUnknownRoom)
	case r.state == RoomWaiting || r.state == RoomReady:
		if err != nil {
			s.fatalf("set ready %d: %v", id, err)
		}
		r.state = RoomReady
	default:
		s.expectErr("set ready", err, errWrongState)
	}
}

func (s *sim) opClaim() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomAdmitted || s.src.intn(12) == 0 })
	err := s.l.Claim(id)
	switch {
	case r == nil:
		s.expectErr("claim", err, errUnknownRoom)
	case r.state == RoomAdmitted || r.state == RoomClaimed:
		if err != nil {
			s.fatalf("claim %d: %v", id, err)
		}
		r.state = RoomClaimed
	default:
		s.expectErr("claim", err, errWrongState)
	}
}

func (s *sim) opStart() {
	id, r := s.pick(func(r *shadowRoom) bool {
		return r.state == RoomAdmitted || r.state == RoomClaimed || r.state == RoomResumed || s.src.intn(12) == 0
	})
	err := s.l.StartRunning(id)
	switch {
	case r == nil:
		s.expectErr("start", err, errUnknownRoom)
	case r.state == RoomAdmitted || r.state == RoomClaimed || r.state == RoomResumed:
		if err != nil {
			s.fatalf("start %d: %v", id, err)
		}
		r.state = RoomRunning
		r.meta = false
		r.req.Rebootstrap = false
	default:
		s.expectErr("start", err, errWrongState)
	}
}

func (s *sim) opUpdate() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	out := 0
	if r != nil {
		out = r.req.OutputLen + s.src.intn(int(s.page)*3+2)
		if s.src.intn(6) == 0 {
			out = r.req.OutputLen + s.src.intn(int(s.maxTotal/2)+1) // big jump
		}
		if s.src.intn(25) == 0 {
			out = r.req.OutputLen - 1 // shrinking
		}
	}
	before := s.l.Stats()
	np, err := s.l.UpdateRunning(id, out)
	switch {
	case r == nil:
		s.expectErr("update", err, errUnknownRoom)
		return
	case r.state != RoomRunning:
		s.expectErr("update", err, errWrongState)
		return
	case out < r.req.OutputLen:
		s.expectErr("update", err, ErrInvalidRequest)
		return
	}
	s.steps++ // grown or not, a decode-step report
	seq := int64(r.req.PromptLen) + int64(out)
	want := max(r.pages, s.pagesFor(seq))
	newFull := want - r.pages
	ok := int(before.Pages.Free) >= newFull
	newFirst := r.swaFirst
	if s.swa != swaNone {
		ev := max(int64(r.swaFirst)*s.page, seq-1-s.window-s.page)
		newFirst = max(r.swaFirst, int(ev/s.page))
		evict := min(newFirst, r.pages) - r.swaFirst
		alloc := max(0, want-max(r.pages, newFirst))
		if int(before.SWAPages.Free)+evict < alloc {
			ok = false
		}
	}
	if !ok {
		s.expectErr("update", err, ErrNoCapacity)
		if after := s.l.Stats(); after != before {
			s.fatalf("failed update changed stats:\n%+v\n%+v", before, after)
		}
		return
	}
	if err != nil || len(np) != newFull {
		s.fatalf("update %d to %d: %d new pages (want %d), %v", id, out, len(np), newFull, err)
	}
	if newFull > 0 {
		s.seen["update: grew"]++
	}
	if newFirst > r.swaFirst {
		s.seen["update: swa evicted"]++
	}
	r.req.OutputLen = out
	r.pages = want
	r.swaFirst = newFirst
	a, _ := s.l.Allocation(id)
	if len(a.Pages) != want || (newFull > 0 && !slices.Equal(np, a.Pages[want-newFull:])) {
		s.fatalf("update %d: allocation has %d pages, want %d", id, len(a.Pages), want)
	}
}

func (s *sim) opRetract() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	err := s.l.Retract(id)
	switch {
	case r == nil:
		s.expectErr("retract", err, errUnknownRoom)
	case r.state == RoomRunning && !s.resumable(r.req):
		// It could never resume: refused, nothing changed.
		s.expectErr("retract", err, errWrongState)
		s.seen["retract: could never resume"]++
	case r.state == RoomRunning:
		if err != nil {
			s.fatalf("retract %d: %v", id, err)
		}
		r.state = RoomRetracted
		r.pages, r.fill, r.swaFirst = 0, 0, 0
		r.retStep = s.steps
		s.retracted = append(s.retracted, id)
	default:
		s.expectErr("retract", err, errWrongState)
	}
}

func (s *sim) opHold() {
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomRunning || s.src.intn(12) == 0 })
	err := s.l.Hold(id)
	switch {
	case r == nil:
		s.expectErr("hold", err, errUnknownRoom)
	case r.state == RoomRunning:
		if err != nil {
			s.fatalf("hold %d: %v", id, err)
		}
		r.state = RoomHeld
		r.pages, r.fill, r.swaFirst = 0, 0, 0
		r.req.OutputLen = max(r.req.OutputLen-1, 0)
		r.req.Rebootstrap = true
		s.held = append(s.held, id)
	default:
		s.expectErr("hold", err, errWrongState)
	}
}

func (s *sim) opResumeHeld() {
	got := s.l.ResumeHeld()
	var want []uint64
	for _, id := range s.held {
		r := s.rooms[id]
		if !s.fits(r.req) {
			delete(s.rooms, id)
			continue
		}
		r.state = RoomWaiting
		r.seq = s.nextSeq
		r.bypassed = 0
		s.nextSeq++
		want = append(want, id)
		s.seen["resume held: room"]++
	}
	s.held = nil
	if !slices.Equal(got, want) {
		s.fatalf("resume held: got %v, want %v", got, want)
	}
}

func (s *sim) opRelease() {
	id, r := s.pick(nil)
	err := s.l.Release(id)
	if r == nil {
		s.expectErr("release", err, errUnknownRoom)
		return
	}
	if err != nil {
		s.fatalf("release %d: %v", id, err)
	}
	if r.state == RoomDraining {
		s.seen["release: draining"]++
	}
	s.forget(id)
	s.expectErr("second release", s.l.Release(id), errUnknownRoom)
}

func (s *sim) forget(id uint64) {
	delete(s.rooms, id)
	s.retracted = slices.DeleteFunc(s.retracted, func(x uint64) bool { return x == id })
	s.held = slices.DeleteFunc(s.held, func(x uint64) bool { return x == id })
}

// opClaimTimeout is what the room manager does when an admitted room's
// claim timeout passes: it releases the room (or drains it, opDrain, when a
// prefill rank may still write into it).
func (s *sim) opClaimTimeout() {
	if s.timeout <= 0 {
		return
	}
	id, r := s.pick(func(r *shadowRoom) bool { return r.state == RoomAdmitted })
	if r == nil || r.state != RoomAdmitted {
		return
	}
	if err := s.l.Release(id); err != nil {
		s.fatalf("release %d at its claim timeout: %v", id, err)
	}
	s.forget(id)
	s.seen["claim timeout: room"]++
}

// opAdmit predicts the pass with a scan of the shadow state, then compares.
func (s *sim) opAdmit() {
	st := s.l.Stats()
	freePages, freeSWA := int(st.Pages.Free), int(st.SWAPages.Free)
	freeReq, freeMeta, freeMamba := int(st.ReqSlots.Free), int(st.MetaSlots.Free), int(st.MambaSlots.Free)
	active := s.active()
	type exp struct {
		id      uint64
		resumed bool
	}
	var want []exp
	reason := BlockNone
	avail := func() int64 {
		a := int64(freePages) * s.page
		if s.swa == swaMirror {
			a = min(a, int64(freeSWA)*s.page)
		}
		return a
	}
	swaBudget := func(single int64) int64 {
		swaAvail := int64(freeSWA) * s.page
		used := int64(s.totalSWA)*s.page - swaAvail
		res := min(s.reserve*active, max(0, active*s.window-used))
		return swaAvail - max(res, single)
	}
	take := func(fill int64) (int, int) {
		p := s.pagesFor(fill)
		sw := 0
		if s.swa != swaNone {
			sw = p - s.firstSWAPage(fill)
		}
		return p, sw
	}
	remaining := slices.Clone(s.retracted)
	running := s.tally()[RoomRunning]
	if len(remaining) > 0 {
		budget := avail() - s.reserve*active
		var swaB int64
		if s.swa == swaTail {
			swaB = swaBudget(0)
		}
		for len(remaining) > 0 {
			r := s.rooms[remaining[0]]
			if r.retStep == s.steps && running > 0 {
				s.seen["resume: waits for a decode step"]++
				break
			}
			f := s.fill(Request{PromptLen: r.req.PromptLen, OutputLen: r.req.OutputLen})
			need := f + s.reserve
			p, sw := take(f)
			if freeReq <= 0 || need > budget || (s.swa == swaTail && s.tail(f) > swaB) ||
				freePages < p || freeSWA < sw || freeMamba < s.spr {
				break
			}
			freeReq--
			freePages -= p
			freeSWA -= sw
			freeMamba -= s.spr
			budget -= need
			swaB -= s.tail(f)
			active++
			want = append(want, exp{r.id, true})
			remaining = remaining[1:]
		}
	}
	switch {
	case len(remaining) > 0:
		reason = BlockRetracted
	case s.draining:
		reason = BlockDraining
	default:
		var ready []*shadowRoom
		var retractable, retractableSWA, maxKey, maxSWAKey int64
		for _, r := range s.rooms {
			switch r.state {
			case RoomReady:
				ready = append(ready, r)
			case RoomRunning:
				retractable += int64(r.req.PromptLen + r.req.OutputLen)
				retractableSWA += s.tail(int64(r.req.PromptLen)) + int64(r.req.OutputLen)
				maxKey = max(maxKey, min(int64(r.req.MaxNewTokens), s.clip)+int64(r.req.PromptLen))
				maxSWAKey = max(maxSWAKey, s.tail(int64(r.req.PromptLen))+min(int64(r.req.MaxNewTokens), s.clip))
			}
		}
		sort.Slice(ready, func(i, j int) bool {
			a, b := ready[i], ready[j]
			switch s.order {
			case orderLowFirst:
				if a.req.Priority != b.req.Priority {
					return a.req.Priority < b.req.Priority
				}
			case orderHighFirst:
				if a.req.Priority != b.req.Priority {
					return a.req.Priority > b.req.Priority
				}
			}
			return a.seq < b.seq
		})
		var single, singleSWA int64
		if running > 0 {
			single = maxKey - retractable
			singleSWA = maxSWAKey - retractableSWA
		}
		budget := avail() - max(s.reserve*active, single)
		var swaB int64
		if s.swa == swaTail {
			swaB = swaBudget(singleSWA)
		}
		// Head-of-line policy: a room that does not fit is set aside while it
		// has been bypassed fewer than max_bypass times (at most 8 per pass);
		// each admission behind it counts one bypass; a room bypassed
		// max_bypass times blocks strictly.
		var aside []*shadowRoom
		asideReason := BlockNone
		for _, r := range ready {
			if freeReq <= 0 {
				reason = BlockReqSlots
				break
			}
			if freeMeta <= 0 {
				reason = BlockMetadataSlots
				break
			}
			if s.spr > freeMamba {
				reason = BlockMamba
				break
			}
			f, o := s.fill(r.req), s.origin(r.req)
			mn := min(int64(r.req.MaxNewTokens), s.clip)
			p, sw := take(f)
			block := BlockNone
			switch {
			case max(int64(s.pagesFor(f))*s.page+s.reserve, o+mn-retractable) > budget:
				block = BlockTokens
			case s.swa == swaTail && max(s.tail(f), s.tail(f)+mn-retractableSWA) > swaB:
				block = BlockSWA
			case freePages < p:
				block = BlockTokens
			case freeSWA < sw && s.swa == swaTail:
				block = BlockSWA
			case freeSWA < sw:
				block = BlockTokens
			}
			if block != BlockNone {
				if r.bypassed < s.maxBypass && len(aside) < 8 {
					aside = append(aside, r)
					if asideReason == BlockNone {
						asideReason = block
					}
					continue
				}
				reason = block
				break
			}
			freeReq--
			freeMeta--
			freePages -= p
			freeSWA -= sw
			freeMamba -= s.spr
			active++
			budget = avail() - max(s.reserve*active, single)
			swaB -= s.tail(f)
			want = append(want, exp{r.id, false})
			exhausted := false
			for _, a := range aside {
				a.bypassed++
				exhausted = exhausted || a.bypassed >= s.maxBypass
			}
			if len(aside) > 0 {
				s.seen["admit: bypassed"]++
			}
			if exhausted {
				s.seen["block: bypass exhausted"]++
				reason = asideReason
				break
			}
		}
		if len(aside) > 0 && reason != BlockReqSlots && reason != BlockMetadataSlots && reason != BlockMamba {
			reason = asideReason // the head's reason
		}
	}

	adm, gotReason := s.l.Admit()
	var got []exp
	for _, a := range adm {
		got = append(got, exp{a.Room, a.Resumed})
	}
	if !slices.Equal(got, want) || gotReason != reason {
		s.fatalf("admit: got %v %s, want %v %s", got, gotReason, want, reason)
	}
	s.seen["block: "+reason.String()]++
	for _, a := range got {
		if a.resumed {
			s.seen["admit: resumed"]++
		} else {
			s.seen["admit: new"]++
		}
	}
	for _, a := range adm {
		r := s.rooms[a.Room]
		if a.Resumed {
			s.retracted = s.retracted[1:]
			r.state = RoomResumed
			r.req.Rebootstrap = false
			r.fill = s.fill(Request{PromptLen: r.req.PromptLen, OutputLen: r.req.OutputLen})
		} else {
			r.state = RoomAdmitted
			r.fill = s.fill(r.req)
			r.meta = true
		}
		r.pages = s.pagesFor(r.fill)
		r.swaFirst = s.firstSWAPage(r.fill)
		s.checkAllocation(r, a)
	}
}

// checkAllocation verifies an admission's allocation against the shadow.
func (s *sim) checkAllocation(r *shadowRoom, a Admission) {
	al := a.Alloc
	xfer := r.pages
	if !a.Resumed {
		xfer = min(s.pagesFor(s.origin(r.req)), r.pages)
	}
	if al.FillLen != int(r.fill) || al.AllocTokens != r.pages*int(s.page) || len(al.Pages) != xfer || al.ReqSlot < 1 {
		s.fatalf("room %d allocation: fill %d alloc %d pages %d req %d; want fill %d alloc %d pages %d",
			r.id, al.FillLen, al.AllocTokens, len(al.Pages), al.ReqSlot, r.fill, r.pages*int(s.page), xfer)
	}
	if (al.MetadataSlot >= 0) != !a.Resumed {
		s.fatalf("room %d metadata slot %d (resumed %v)", r.id, al.MetadataSlot, a.Resumed)
	}
	switch s.cfg.Pool.Kind {
	case kvlayout.KindHybridLinear:
		if len(al.State) != 1 || len(al.State[0].Indices) != 1 || len(al.MambaPingPong) != s.spr-1 {
			s.fatalf("room %d mamba state %+v", r.id, al)
		}
	case kvlayout.KindHybridMLA:
		if len(al.State) != 1 || !slices.Equal(al.State[0].Indices, al.Pages) {
			s.fatalf("room %d DSA state differs from pages", r.id)
		}
	case kvlayout.KindHybridSWA:
		live := r.pages - r.swaFirst
		wantN := live
		if !a.Resumed {
			o := s.origin(r.req)
			lo := max(0, min(int(max(0, o-s.window)/s.page)-r.swaFirst, live))
			hi := max(lo, min(xfer-r.swaFirst, live))
			wantN = hi - lo
		}
		if len(al.State) != 1 || len(al.State[0].Indices) != wantN {
			s.fatalf("room %d SWA state %d pages, want %d", r.id, len(al.State[0].Indices), wantN)
		}
	default:
		if len(al.State) != 0 {
			s.fatalf("room %d unexpected state %+v", r.id, al.State)
		}
	}
}

// check compares the ledger with the shadow after every operation: the
// invariants, every room's state, request and metadata slot (read under one lock,
// white-box, plus one room through the public accessors), and the stats.
func (s *sim) check(n int) {
	s.t.Helper()
	if err := s.l.CheckInvariants(); err != nil {
		s.fatalf("op %d: invariants: %v", n, err)
	}
	st := s.l.Stats()
	var pages, swaPages, req, meta int
	var dPages, dSWA, dReq, dMeta int
	var retractable int64
	var counts [numRoomStates]int
	var mismatch string
	s.l.mu.Lock()
	if len(s.l.rooms) != len(s.rooms) {
		mismatch = fmt.Sprintf("ledger has %d rooms, shadow %d", len(s.l.rooms), len(s.rooms))
	}
	for id, r := range s.rooms {
		counts[r.state]++
		lr, ok := s.l.rooms[id]
		if ok {
			lr = lr.view()
		}
		switch {
		case !ok:
			mismatch = fmt.Sprintf("room %d missing from the ledger", id)
		case lr.state != r.state:
			mismatch = fmt.Sprintf("room %d state %s, shadow %s", id, lr.state, r.state)
		case lr.req.OutputLen != r.req.OutputLen || lr.req.Rebootstrap != r.req.Rebootstrap:
			mismatch = fmt.Sprintf("room %d request %+v, shadow %+v", id, lr.req, r.req)
		case r.meta != (lr.metaSlot >= 0):
			mismatch = fmt.Sprintf("room %d metadata slot %d, shadow has one: %v", id, lr.metaSlot, r.meta)
		}
		if s.holds(r) {
			pages += r.pages
			req++
			if s.swa != swaNone {
				swaPages += r.pages - r.swaFirst
			}
		}
		if r.meta {
			meta++
		}
		if r.state == RoomDraining {
			dPages += r.pages
			dReq++
			if s.swa != swaNone {
				dSWA += r.pages - r.swaFirst
			}
			if r.meta {
				dMeta++
			}
		}
		if r.state == RoomRunning {
			retractable += int64(r.req.PromptLen + r.req.OutputLen)
		}
	}
	s.l.mu.Unlock()
	if mismatch != "" {
		s.fatalf("op %d: %s", n, mismatch)
	}
	if id, r := s.pick(nil); r != nil {
		got, _ := s.l.State(id)
		gr, _ := s.l.RoomRequest(id)
		al, ok := s.l.Allocation(id)
		if got != r.state || gr != r.req || (ok && (al.MetadataSlot >= 0) != r.meta) {
			s.fatalf("op %d: accessors of room %d: %s %+v metadata slot %d %v; shadow %s %+v %v", n, id, got, gr, al.MetadataSlot, ok, r.state, r.req, r.meta)
		}
	}
	want := [...]int{counts[RoomWaiting], counts[RoomReady], counts[RoomAdmitted], counts[RoomClaimed], counts[RoomResumed], counts[RoomRunning], counts[RoomRetracted], counts[RoomHeld], counts[RoomDraining]}
	got := [...]int{st.Waiting, st.Ready, st.Admitted, st.Claimed, st.Resumed, st.Running, st.Retracted, st.Held, st.Draining}
	if want != got {
		s.fatalf("op %d: state counts %v, shadow %v", n, got, want)
	}
	if int(st.Pages.Used) != pages || int(st.SWAPages.Used) != swaPages || int(st.ReqSlots.Used) != req ||
		int(st.MetaSlots.Used) != meta || int(st.MambaSlots.Used) != req*s.spr || st.Retractable != retractable {
		s.fatalf("op %d: stats %+v; shadow pages %d swa %d req %d meta %d retractable %d", n, st, pages, swaPages, req, meta, retractable)
	}
	if int(st.Pages.Draining) != dPages || int(st.SWAPages.Draining) != dSWA || int(st.ReqSlots.Draining) != dReq ||
		int(st.MetaSlots.Draining) != dMeta || int(st.MambaSlots.Draining) != dReq*s.spr {
		s.fatalf("op %d: draining stats %+v; shadow pages %d swa %d req %d meta %d", n, st, dPages, dSWA, dReq, dMeta)
	}
}

// releaseAll releases every room (in random order) and checks the ledger is
// back to full.
func (s *sim) releaseAll() {
	s.t.Helper()
	ids := make([]uint64, 0, len(s.rooms))
	for id := range s.rooms {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for i := len(ids) - 1; i > 0; i-- {
		j := s.src.intn(i + 1)
		ids[i], ids[j] = ids[j], ids[i]
	}
	for _, id := range ids {
		if err := s.l.Release(id); err != nil {
			s.fatalf("final release %d: %v", id, err)
		}
		s.forget(id)
		if err := s.l.CheckInvariants(); err != nil {
			s.fatalf("after final release of %d: %v", id, err)
		}
	}
	assertFull(s.t, s.l)
}

// opDrain drains a random room: rooms holding an allocation drain (and stay
// exactly as big), others are refused.
func (s *sim) opDrain() {
	id, r := s.pick(func(r *shadowRoom) bool { return s.holds(r) || s.src.intn(8) == 0 })
	before := s.l.Stats()
	err := s.l.DrainRoom(id)
	switch {
	case r == nil:
		s.expectErr("drain", err, errUnknownRoom)
	case r.state == RoomDraining:
		if err != nil {
			s.fatalf("drain again %d: %v", id, err)
		}
		s.seen["drain: again"]++
	case s.holds(r):
		if err != nil {
			s.fatalf("drain %d (%s): %v", id, r.state, err)
		}
		after := s.l.Stats()
		if after.Pages.Used != before.Pages.Used || after.SWAPages.Used != before.SWAPages.Used ||
			after.ReqSlots.Used != before.ReqSlots.Used || after.MetaSlots.Used != before.MetaSlots.Used {
			s.fatalf("drain %d changed the pools:\n%+v\n%+v", id, before, after)
		}
		r.state = RoomDraining
		s.seen["drain: room"]++
	default:
		s.expectErr("drain", err, errWrongState)
	}
}

// opAdopt re-declares a running room on free pages and slots read from the
// ledger's free lists, with at most one defect, and predicts the outcome.
func (s *sim) opAdopt() {
	l := s.l
	l.mu.Lock()
	freeP := slices.Clone(l.pages.free)
	freeS := slices.Clone(l.swaPages.free)
	var freeR, freeM []int32
	for i := 0; i < l.reqSlots.avail(); i++ {
		freeR = append(freeR, l.reqSlots.at(i))
	}
	for i := 0; i < l.mambaS.avail(); i++ {
		freeM = append(freeM, l.mambaS.at(i))
	}
	// Something held, to name in a conflict: a holding room's first page,
	// SWA page, row and Mamba slot.
	var heldP, heldS, heldR, heldM []int32
	for _, id := range slices.Sorted(maps.Keys(l.rooms)) {
		r := l.rooms[id]
		if !r.state.holdsAllocation() {
			continue
		}
		if len(r.pages) > 0 {
			heldP = append(heldP, r.pages[0])
		}
		if r.swa != nil && len(r.swa) > r.swaOff {
			heldS = append(heldS, r.swa[r.swaOff])
		}
		heldR = append(heldR, r.reqSlot)
		if r.nMamba > 0 {
			heldM = append(heldM, r.mamba[0])
		}
	}
	l.mu.Unlock()
	choose := func(from []int32, n int) []int32 {
		from = slices.Clone(from)
		out := make([]int32, 0, n)
		for i := 0; i < n; i++ {
			j := i + s.src.intn(len(from)-i)
			from[i], from[j] = from[j], from[i]
			out = append(out, from[i])
		}
		return out
	}
	req := Request{
		Room:         s.nextID + 1,
		RID:          fmt.Sprintf("a%d", s.nextID+1),
		PromptLen:    s.src.intn(int(s.maxTotal/24) + 1),
		OutputLen:    s.src.intn(int(s.page)*3 + 2),
		MaxNewTokens: s.src.intn(int(s.clip) * 2),
		Priority:     s.src.intn(4),
	}
	seq := int64(req.PromptLen + req.OutputLen)
	nP := s.pagesFor(seq)
	minLive, nS := 0, 0
	if s.swa != swaNone {
		minLive = nP - int(max(0, seq-s.window)/s.page)
		nS = minLive + s.src.intn(nP-minLive+1)
	}
	if nP > len(freeP) || nS > len(freeS) || len(freeR) == 0 || s.spr > len(freeM) {
		s.seen["adopt: no room"]++
		return
	}
	a := Adoption{Request: req, ReqSlot: choose(freeR, 1)[0], Pages: choose(freeP, nP)}
	if s.swa != swaNone {
		a.SWAPages = choose(freeS, nS)
	}
	if s.spr > 0 {
		a.MambaSlots = choose(freeM, s.spr)
	}
	var want error = nil
	switch s.src.intn(14) {
	case 0:
		if len(heldP) > 0 && nP > 0 {
			a.Pages[s.src.intn(nP)] = heldP[s.src.intn(len(heldP))]
			want = ErrOwned
		}
	case 1:
		if nP > 1 {
			a.Pages[nP-1] = a.Pages[0]
			want = ErrInvalidRequest
		}
	case 2:
		if nP > 0 {
			a.Pages[s.src.intn(nP)] = int32(s.totalPages + s.src.intn(3))
			want = ErrInvalidRequest
		}
	case 3:
		if s.src.intn(2) == 0 && nP > 0 {
			a.Pages = a.Pages[:nP-1]
		} else {
			a.Request.OutputLen += int(s.page) // one more page's worth of tokens
		}
		want = ErrInvalidRequest
	case 4:
		if len(heldR) > 0 {
			a.ReqSlot = heldR[s.src.intn(len(heldR))]
			want = ErrOwned
		}
	case 5:
		a.ReqSlot = int32(s.src.intn(2)) << 20 // 0 (padding) or far out of range
		want = ErrInvalidRequest
	case 6:
		switch {
		case s.swa != swaNone && len(heldS) > 0 && nS > 0:
			a.SWAPages[0] = heldS[s.src.intn(len(heldS))]
			want = ErrOwned
		case s.swa != swaNone && minLive > 0:
			a.SWAPages = a.SWAPages[:minLive-1]
			want = ErrInvalidRequest
		case s.spr > 0 && len(heldM) > 0:
			a.MambaSlots[s.spr-1] = heldM[s.src.intn(len(heldM))]
			want = ErrOwned
		case s.spr > 1:
			a.MambaSlots[1] = a.MambaSlots[0]
			want = ErrInvalidRequest
		}
	case 7:
		if id, old := s.pick(nil); old != nil {
			a.Request.Room = id
			want = errRoomExists
		}
	}
	before, lists := s.l.Stats(), freeLists(s.l)
	err := s.l.Adopt(a)
	if want != nil {
		s.expectErr("adopt", err, want)
		if after := s.l.Stats(); after != before || freeLists(s.l) != lists {
			s.fatalf("refused adopt changed the ledger:\n%+v\n%+v", before, after)
		}
		return
	}
	if err != nil {
		s.fatalf("adopt %+v: %v", a, err)
	}
	s.rooms[req.Room] = &shadowRoom{id: req.Room, req: req, state: RoomRunning, seq: s.nextSeq,
		fill: seq, pages: nP, swaFirst: nP - nS}
	s.nextSeq++
	s.nextID = max(s.nextID, req.Room)
	s.seen["adopt: room"]++
}

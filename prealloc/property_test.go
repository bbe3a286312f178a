package prealloc

import (
	"math/rand/v2"
	"slices"
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

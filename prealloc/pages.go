package prealloc

import "math/bits"

// pageStack is a LIFO free list of int32 indices (KV pages or SWA pages).
// Taking n indices and giving them back are O(n) with no heap allocation: the
// backing arrays are sized to the pool once and never grow. pos indexes the
// free list by page so that a specific page can be tested and taken in O(1)
// (takePage, for Adopt). It is a sparse set: pos[p] is p's index in free
// while p is free and stale once p is taken (p is free iff
// pos[p] < len(free) and free[pos[p]] == p), so taking pages never writes
// pos; only give does, one write per page.
type pageStack struct {
	free  []int32
	pos   []int32 // pos[p] = index of p in free while p is free
	total int
}

// newPageStack returns a stack holding 0..n-1 that pops in ascending order.
func newPageStack(n int) pageStack {
	free := make([]int32, n)
	pos := make([]int32, n)
	for i := range free {
		free[i] = int32(n - 1 - i)
		pos[n-1-i] = int32(i)
	}
	return pageStack{free: free, pos: pos, total: n}
}

func (s *pageStack) avail() int { return len(s.free) }

// inRange reports whether p is one of the pool's pages.
func (s *pageStack) inRange(p int32) bool { return p >= 0 && int(p) < s.total }

// loc is where p would sit in the free list if it were free: pos[p] if
// that is inside the free list, else -1 (p is held).
func (s *pageStack) loc(p int32) int {
	if i := int(s.pos[p]); i < len(s.free) {
		return i
	}
	return -1
}

// slots is the free list, for checkIndices.
func (s *pageStack) slots() []int32 { return s.free }

// isFree reports whether page p (in range) is on the free list.
func (s *pageStack) isFree(p int32) bool {
	i := s.loc(p)
	return i >= 0 && s.free[i] == p
}

// take pops n indices and appends them to dst in pop order. The caller has
// checked avail() >= n and that dst has room for n more elements.
func (s *pageStack) take(dst []int32, n int) []int32 {
	k := len(s.free) - n
	for i := len(s.free) - 1; i >= k; i-- {
		dst = append(dst, s.free[i])
	}
	s.free = s.free[:k]
	return dst
}

// takePage removes the free page p from the list in O(1): the top of the
// stack moves into its place. The caller has checked isFree(p).
func (s *pageStack) takePage(p int32) {
	i, last := s.pos[p], len(s.free)-1
	top := s.free[last]
	s.free[i] = top
	s.pos[top] = i
	s.free = s.free[:last]
}

// give pushes indices back. They are pushed in reverse so that an immediate
// take of the same count returns them in the same order.
func (s *pageStack) give(idx []int32) {
	for i := len(idx) - 1; i >= 0; i-- {
		v := idx[i]
		s.pos[v] = int32(len(s.free))
		s.free = append(s.free, v)
	}
}

// slotRing is a FIFO of int32 slot indices: pop takes the oldest free slot,
// push appends a freed one at the back. It mirrors SGLang's allocators that
// hand out free_slots from the front and append frees at the end
// (DecodeReqToTokenPool, ReqToMetadataIdxAllocator's deque).
//
// pos indexes the ring by slot so that a specific slot can be tested and
// taken in O(1) (takeSlot, for Adopt). Like pageStack.pos it is a sparse
// set: pos[v-first] is v's index in buf while v is free, stale once v is
// popped (v is free iff that index lies in the free region [head,
// head+n) and holds v); pop never writes it, push does.
type slotRing struct {
	buf   []int32
	pos   []int32 // pos[v-first] = index of v in buf while v is free
	first int32
	head  int
	n     int
}

// newSlotRing returns a ring holding first, first+1, ..., first+count-1.
func newSlotRing(first, count int) slotRing {
	buf := make([]int32, count)
	pos := make([]int32, count)
	for i := range buf {
		buf[i] = int32(first + i)
		pos[i] = int32(i)
	}
	return slotRing{buf: buf, pos: pos, first: int32(first), n: count}
}

func (r *slotRing) avail() int { return r.n }

// inRange reports whether v is one of the ring's slots.
func (r *slotRing) inRange(v int32) bool {
	return v >= r.first && int64(v)-int64(r.first) < int64(len(r.buf))
}

// loc is where v would sit in buf if it were free: its recorded index if
// that lies in the free region, else -1 (v is held).
func (r *slotRing) loc(v int32) int {
	i := int(r.pos[v-r.first])
	off := i - r.head
	if off < 0 {
		off += len(r.buf)
	}
	if off < r.n {
		return i
	}
	return -1
}

// slots is the ring's backing array, for checkIndices.
func (r *slotRing) slots() []int32 { return r.buf }

// isFree reports whether slot v (in range) is free.
func (r *slotRing) isFree(v int32) bool {
	i := r.loc(v)
	return i >= 0 && r.buf[i] == v
}

func (r *slotRing) pop() int32 {
	v := r.buf[r.head]
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.n--
	return v
}

func (r *slotRing) push(v int32) {
	i := r.head + r.n
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	r.buf[i] = v
	r.pos[v-r.first] = int32(i)
	r.n++
}

// takeSlot removes the free slot v in O(1): the oldest free slot (the next
// pop) moves into v's place, every other free slot keeps its FIFO position.
// The caller has checked isFree(v).
func (r *slotRing) takeSlot(v int32) {
	i := r.pos[v-r.first]
	if h := int32(r.head); i != h {
		u := r.buf[h]
		r.buf[i] = u
		r.pos[u-r.first] = i
		r.buf[h] = v
		r.pos[v-r.first] = h
	}
	r.pop()
}

// at returns the i-th free slot in FIFO order (0 is the next pop).
func (r *slotRing) at(i int) int32 {
	j := r.head + i
	if j >= len(r.buf) {
		j -= len(r.buf)
	}
	return r.buf[j]
}

// slicePool recycles the per-room []int32 page lists so that steady-state
// admission and growth do not allocate. Slices are kept in buckets by
// power-of-two capacity; retained memory is bounded by limit elements.
type slicePool struct {
	buckets  [32][][]int32
	retained int
	limit    int
}

// bucketOf is the bucket whose capacity (1<<b) is the smallest power of two
// >= n.
func bucketOf(n int) int {
	if n <= 1 {
		return 0
	}
	return bits.Len(uint(n - 1))
}

// get returns an empty slice with capacity >= n (nil for n == 0).
func (p *slicePool) get(n int) []int32 {
	if n <= 0 {
		return nil
	}
	b := bucketOf(n)
	if b >= len(p.buckets) {
		return make([]int32, 0, n)
	}
	if k := len(p.buckets[b]); k > 0 {
		s := p.buckets[b][k-1]
		p.buckets[b][k-1] = nil
		p.buckets[b] = p.buckets[b][:k-1]
		p.retained -= cap(s)
		return s[:0]
	}
	return make([]int32, 0, 1<<b)
}

// put returns a slice for reuse. Slices whose capacity is not a power of two
// (not made by get) or that would exceed the retention limit are dropped.
func (p *slicePool) put(s []int32) {
	c := cap(s)
	if c == 0 || c&(c-1) != 0 || p.retained+c > p.limit {
		return
	}
	b := bits.TrailingZeros(uint(c))
	if b >= len(p.buckets) {
		return
	}
	p.buckets[b] = append(p.buckets[b], s[:0])
	p.retained += c
}

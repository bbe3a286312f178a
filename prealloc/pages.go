package prealloc

import "math/bits"

// pageStack is a LIFO free list of int32 indices (KV pages or SWA pages).
// Taking n indices and giving them back are O(n) with no heap allocation: the
// backing array is sized to the pool once and never grows.
type pageStack struct {
	free  []int32
	total int
}

// newPageStack returns a stack holding 0..n-1 that pops in ascending order.
func newPageStack(n int) pageStack {
	free := make([]int32, n)
	for i := range free {
		free[i] = int32(n - 1 - i)
	}
	return pageStack{free: free, total: n}
}

func (s *pageStack) avail() int { return len(s.free) }

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

// give pushes indices back. They are pushed in reverse so that an immediate
// take of the same count returns them in the same order.
func (s *pageStack) give(idx []int32) {
	for i := len(idx) - 1; i >= 0; i-- {
		s.free = append(s.free, idx[i])
	}
}

// slotRing is a FIFO of int32 slot indices: pop takes the oldest free slot,
// push appends a freed one at the back. It mirrors SGLang's allocators that
// hand out free_slots from the front and append frees at the end
// (DecodeReqToTokenPool, ReqToMetadataIdxAllocator's deque).
type slotRing struct {
	buf  []int32
	head int
	n    int
}

// newSlotRing returns a ring holding first, first+1, ..., first+count-1.
func newSlotRing(first, count int) slotRing {
	buf := make([]int32, count)
	for i := range buf {
		buf[i] = int32(first + i)
	}
	return slotRing{buf: buf, n: count}
}

func (r *slotRing) avail() int { return r.n }

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
	r.n++
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

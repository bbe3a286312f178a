package prealloc

// roomHeap is an indexed binary heap of rooms: each room records its
// position (through pos) so that any room can be removed in O(log n), and
// the minimum (by less) is peeked in O(1).
type roomHeap struct {
	items []*room
	less  func(a, b *room) bool
	pos   func(r *room) *int32
}

func (h *roomHeap) len() int { return len(h.items) }

func (h *roomHeap) peek() *room {
	if len(h.items) == 0 {
		return nil
	}
	return h.items[0]
}

func (h *roomHeap) push(r *room) {
	*h.pos(r) = int32(len(h.items))
	h.items = append(h.items, r)
	h.up(len(h.items) - 1)
}

func (h *roomHeap) pop() *room {
	if len(h.items) == 0 {
		return nil
	}
	r := h.items[0]
	h.remove(r)
	return r
}

// remove takes r out of the heap. r must be in it.
func (h *roomHeap) remove(r *room) {
	i := int(*h.pos(r))
	last := len(h.items) - 1
	if i != last {
		h.swap(i, last)
	}
	h.items[last] = nil
	h.items = h.items[:last]
	*h.pos(r) = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h *roomHeap) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.pos(h.items[i]) = int32(i)
	*h.pos(h.items[j]) = int32(j)
}

func (h *roomHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h *roomHeap) down(i0 int) bool {
	i := i0
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			m = r
		}
		if !h.less(h.items[m], h.items[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > i0
}

// valid reports whether positions and the heap order are consistent.
func (h *roomHeap) valid() bool {
	for i, r := range h.items {
		if int(*h.pos(r)) != i {
			return false
		}
		if i > 0 && h.less(r, h.items[(i-1)/2]) {
			return false
		}
	}
	return true
}

// roomList is an intrusive doubly linked FIFO of rooms (the retracted queue
// and the held rebootstrap list). A room is in at most one list.
type roomList struct {
	head, tail *room
	n          int
}

func (l *roomList) pushBack(r *room) {
	r.prev, r.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = r
	} else {
		l.head = r
	}
	l.tail = r
	l.n++
}

func (l *roomList) remove(r *room) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		l.tail = r.prev
	}
	r.prev, r.next = nil, nil
	l.n--
}

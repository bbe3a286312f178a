package client

import (
	"sync"
	"testing"
)

// TestSendQueuePacks: a message pushed while a write is in flight goes
// into the next write with the others queued meanwhile, in push order, at
// most max per write; no pusher waits for a write (the first returns
// while its message is being written); close waits for the writer and
// refuses later pushes.
func TestSendQueuePacks(t *testing.T) {
	var (
		mu     sync.Mutex
		writes [][]int
	)
	inWrite, release := make(chan struct{}), make(chan struct{})
	first := true
	q := newSendQueue(3, 0, nil, func(m int, more []int) {
		mu.Lock()
		writes = append(writes, append([]int{m}, more...))
		block := first
		first = false
		mu.Unlock()
		if block {
			close(inWrite)
			<-release
		}
	})
	seq := 0
	number := func(m *int) func() bool { return func() bool { seq++; *m = seq; return true } }
	var m int
	if !q.push(0, number(&m)) { // returns while the writer is in its write
		t.Fatal("first push refused")
	}
	<-inWrite
	// Four pushed while the first write is in flight: queued, not written
	// by their pushers, who return at once.
	for range 4 {
		if !q.push(0, func() bool { seq++; return true }) {
			t.Fatal("push refused")
		}
	}
	close(release)
	q.close(nil)
	if q.push(9, nil) {
		t.Error("push after close accepted")
	}
	mu.Lock()
	defer mu.Unlock()
	// The numbers are what each push's add saw; the values pushed are 0,
	// so check the shape: 1, then 3 (max), then 1.
	if len(writes) != 3 || len(writes[0]) != 1 || len(writes[1]) != 3 || len(writes[2]) != 1 {
		t.Errorf("writes = %v, want sizes 1, 3, 1 (the four queued meanwhile packed by 3)", writes)
	}
	if seq != 5 {
		t.Errorf("add ran %d times, want 5", seq)
	}
}

// TestSendQueueOrder: many concurrent pushers; every message is written
// exactly once, in the order its add numbered it (what the sessions rely
// on: seq assigned in add must strictly increase on the wire).
func TestSendQueueOrder(t *testing.T) {
	var got []int // written by one writer at a time
	q := newSendQueue(8, 0, nil, func(m *int, more []*int) {
		got = append(got, *m)
		for _, x := range more {
			got = append(got, *x)
		}
	})
	next := 0 // under the queue's lock (add)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 200 {
				msg := new(int)
				q.push(msg, func() bool { next++; *msg = next; return true })
			}
		})
	}
	wg.Wait()
	q.close(nil) // waits for the writer
	if len(got) != 16*200 {
		t.Fatalf("%d messages written, want %d", len(got), 16*200)
	}
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("message %d written as the %dth, want in order", v, i+1)
		}
	}
}

// TestSendQueueBudget: a write packs messages while their sizes add up to
// at most the budget; a message larger than the budget goes alone.
func TestSendQueueBudget(t *testing.T) {
	var writes [][]int
	inWrite, release := make(chan struct{}), make(chan struct{})
	first := true
	q := newSendQueue(64, 1000, func(m int) int { return m }, func(m int, more []int) {
		writes = append(writes, append([]int{m}, more...))
		if first {
			first = false
			close(inWrite)
			<-release
		}
	})
	done := make(chan struct{})
	go func() { defer close(done); q.push(1, nil) }()
	<-inWrite
	for _, m := range []int{400, 400, 400, 1500, 10, 10} {
		q.push(m, nil)
	}
	close(release)
	<-done
	q.close(nil) // waits for the writer
	want := [][]int{{1}, {400, 400}, {400}, {1500}, {10, 10}}
	if len(writes) != len(want) {
		t.Fatalf("writes = %v, want %v", writes, want)
	}
	for i := range want {
		if len(writes[i]) != len(want[i]) || writes[i][0] != want[i][0] {
			t.Fatalf("writes = %v, want %v", writes, want)
		}
	}
}

// TestSendQueueStalledWrite: while the stream is stalled (a write that
// does not return: a daemon that stopped reading), pushes still return at
// once, so the ops behind them wait on their own contexts.
func TestSendQueueStalledWrite(t *testing.T) {
	stall, stalled := make(chan struct{}), make(chan struct{})
	var once sync.Once
	q := newSendQueue(64, 0, nil, func(int, []int) {
		once.Do(func() { close(stalled) })
		<-stall
	})
	for i := range 100 {
		if !q.push(i, nil) {
			t.Fatalf("push %d refused", i)
		}
	}
	<-stalled
	close(stall) // the stream's end unblocks the write
	q.close(nil)
}

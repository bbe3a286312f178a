package client

import (
	"context"
	"slices"
	"sync"

	"google.golang.org/grpc/metadata"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// sendQueue writes a stream's messages in order, one writer at a time,
// packing the messages queued while a write was in flight into the next
// one (the sessions' "more" field): under load many ops share one
// message (a group commit, no timer). The writer is a goroutine started
// by the push that found none writing and gone once the queue is empty:
// a pusher never waits for the wire, so an op whose context ends while
// the stream is stalled (a daemon that stopped reading) returns on time.
type sendQueue[M any] struct {
	max  int                     // messages per write, the first included
	send func(first M, more []M) // writes one message; errors show on the stream's read side
	// size, when set, is a message's size for the budget: a write packs
	// messages while their sizes add up to at most budget (the first goes
	// whatever its size).
	size    func(M) int
	budget  int
	mu      sync.Mutex
	idle    sync.Cond // signalled when the writer stops
	queue   []M
	writing bool
	closed  bool
}

func newSendQueue[M any](max, budget int, size func(M) int, send func(first M, more []M)) *sendQueue[M] {
	q := &sendQueue[M]{max: max, send: send, size: size, budget: budget}
	q.idle.L = &q.mu
	return q
}

// push queues m, after add (under the queue's lock, so in the order of
// the writes: it numbers the message) returned true, and starts the writer
// unless it runs. false: the queue was closed or add refused, nothing
// queued.
func (q *sendQueue[M]) push(m M, add func() bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || (add != nil && !add()) {
		return false
	}
	q.queue = append(q.queue, m)
	if !q.writing {
		q.writing = true
		go q.write()
	}
	return true
}

// write is the writer: it writes what is queued until the queue is empty
// (or closed), packing.
func (q *sendQueue[M]) write() {
	q.mu.Lock()
	for len(q.queue) > 0 && !q.closed {
		n := min(len(q.queue), q.max)
		if q.size != nil {
			bytes := q.size(q.queue[0])
			for i := 1; i < n; i++ {
				if bytes += q.size(q.queue[i]); bytes > q.budget {
					n = i
					break
				}
			}
		}
		first := q.queue[0]
		var more []M
		if n > 1 {
			more = append(make([]M, 0, n-1), q.queue[1:n]...)
		}
		clear(q.queue[:n])
		q.queue = q.queue[n:]
		q.mu.Unlock()
		q.send(first, more)
		q.mu.Lock()
	}
	if len(q.queue) == 0 {
		q.queue = nil // let a burst's backing array go
	}
	q.writing = false
	q.idle.Broadcast()
	q.mu.Unlock()
}

// setMax sets how many messages a write takes, the first included (the
// packing a stream negotiated: 1 until the daemon said it reads them).
func (q *sendQueue[M]) setMax(max int) {
	q.mu.Lock()
	q.max = max
	q.mu.Unlock()
}

// close waits for the writer to finish what is queued, then refuses new
// messages and runs last (e.g. CloseSend) before any other write.
func (q *sendQueue[M]) close(last func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.writing {
		q.idle.Wait()
	}
	if q.closed {
		return
	}
	q.closed = true
	if last != nil {
		last()
	}
}

// withPack asks the daemon for packed session events (pb.PackKey): the
// Go client reads EngineEvent.more and PrefillEvent.more.
func withPack(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, pb.PackKey, pb.PackMore)
}

// packs reports whether a session's response header says the daemon reads
// packed requests.
func packs(md metadata.MD) bool {
	return slices.Contains(md.Get(pb.PackKey), pb.PackMore)
}

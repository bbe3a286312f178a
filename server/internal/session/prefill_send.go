package session

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The prefill session's sending half: one queue, one sender (the handler's
// goroutine).

// errSlowConsumer ends a session whose queue filled.
var errSlowConsumer = status.Errorf(codes.ResourceExhausted,
	"slow consumer: the session's queue of %d messages is full; its claims stand as after a dropped AwaitDestination stream, reconnect and claim again", Queue)

// push queues a message without blocking; a full queue cuts the session.
func (ss *prefillSession) push(it prefillItem) {
	ss.mu.Lock()
	ss.pushLocked(it)
	ss.mu.Unlock()
}

// pushLocked is push with ss.mu held.
func (ss *prefillSession) pushLocked(it prefillItem) {
	if ss.closed || ss.ctx.Err() != nil {
		return
	}
	if ss.scanning {
		ss.burst++ // the hello's offers: outside the bound
	} else if len(ss.queue) >= Queue+ss.burst {
		ss.closed = true
		ss.cancel(errSlowConsumer)
		return
	}
	ss.queue = append(ss.queue, it)
	signal(ss.wake)
}

// send is the session's one sender: it sends the queue in order until the
// session ends, or, asked to flush, until the queue is empty.
func (ss *prefillSession) send() {
	defer close(ss.sent)
	for {
		if !ss.sendQueued() {
			return
		}
		select {
		case <-ss.wake:
		case <-ss.ctx.Done():
			return
		case <-ss.flush:
			ss.sendQueued()
			return
		}
	}
}

// sendQueued sends what is queued, packed; false when a send failed (the
// session is cut with its error).
func (ss *prefillSession) sendQueued() bool {
	// A client that does not read packed events gets one per message.
	limit := 1
	if ss.pack {
		limit = pb.MaxPrefillEventsPerMessage
	}
	var batch []prefillItem
	for {
		batch = ss.take(batch[:0], limit)
		if len(batch) == 0 {
			return true
		}
		ev := batch[0].ev
		if len(batch) > 1 {
			ev.More = make([]*pb.PrefillEvent, len(batch)-1)
			for i, b := range batch[1:] {
				ev.More[i] = b.ev
			}
		}
		if err := ss.stream.Send(ev); err != nil {
			ss.cancel(err)
			return false
		}
		for _, b := range batch {
			if b.after != nil {
				b.after()
			}
		}
		clear(batch)
	}
}

// take moves the next message's items from the queue into batch: the
// first, then as many as fit in limit entries and about
// MaxSessionMessageBytes.
func (ss *prefillSession) take(batch []prefillItem, limit int) []prefillItem {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.queue) == 0 {
		return batch
	}
	n, bytes := 1, prefillEventSize(ss.queue[0].ev)
	for n < min(len(ss.queue), limit) {
		b := prefillEventSize(ss.queue[n].ev)
		if bytes+b > pb.MaxSessionMessageBytes {
			break
		}
		n, bytes = n+1, bytes+b
	}
	batch = append(batch, ss.queue[:n]...)
	clear(ss.queue[:n])
	ss.queue = ss.queue[n:]
	ss.burst = max(0, ss.burst-n) // the hello's offers go first
	return batch
}

// prefillEventSize is a message's size for the packing budget: a
// destination (which grows with the room's pages) or a failure measured,
// anything else bounded from above.
func prefillEventSize(ev *pb.PrefillEvent) int {
	if re := ev.GetRoom().GetEvent(); re.GetDestination() != nil || re.GetFailure() != nil {
		return proto.Size(ev)
	}
	if r := ev.GetResult(); r != nil && r.GetError() != nil {
		return proto.Size(ev) // an error's message and metadata
	}
	return prefillEventSizeBound
}

// prefillEventSizeBound bounds from above the size of a session message
// that carries no destination and no error.
const prefillEventSizeBound = 1 << 10

// prefillError is an op's refusal: its code, message and ErrorInfo.
func prefillError(err error) *pb.PrefillError {
	st := status.Convert(err)
	e := &pb.PrefillError{Code: uint32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return e
}

package session

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// engineSub is a room an op subscribed: its watch's sink
// (kvmanager.WatchSink), which the room manager calls under the room's
// shard lock, in the room's order. Until the op's reply is queued
// (activate) the events wait in pending, so that the reply comes first;
// then they go to the queue as they come, numbered by their position in
// the room's timeline (RoomEvent.Seq), those up to after skipped.
type engineSub struct {
	es      *engineSession
	room    uint64
	w       *kvmanager.Watcher
	outcome bool // ENGINE_EVENTS_OUTCOME: one event, the last
	// resume: a Watch's subscription, whose replay (the events up to
	// last, the room's last event when the watch began) is exempt from
	// the slow-consumer bound (engineSession.replay).
	resume      bool
	after, last uint32
	// Under es.mu.
	active  bool
	pending []kvmanager.RoomEvent
	ended   bool  // End was called
	endErr  error // ... with this error
	removed bool  // the stream forgot it
}

// subscribe watches room's whole timeline (ENGINE_EVENTS_ALL, as WatchRoom
// with history) or only its outcome (ENGINE_EVENTS_OUTCOME), the events up
// to after already seen. Errors are statuses.
func (es *engineSession) subscribe(ctx context.Context, room uint64, events pb.EngineEvents, after uint32, resume bool) (*engineSub, error) {
	sb := &engineSub{es: es, room: room, outcome: events == pb.EngineEvents_ENGINE_EVENTS_OUTCOME, resume: resume}
	w, err := es.t.WatchFunc(ctx, room, sb.outcome, sb)
	if err != nil {
		return nil, err
	}
	es.mu.Lock()
	sb.w = w
	// An after beyond the room's last event sends what comes next.
	sb.last = w.Last()
	sb.after = min(after, sb.last)
	es.mu.Unlock()
	return sb, nil
}

// activate starts queueing sb's events, after its op's reply: the events
// it holds, then as they come; or stops the watch when the stream ended.
func (es *engineSession) activate(sb *engineSub) {
	es.mu.Lock()
	_, dup := es.subs[sb.room] // a batch that names a room twice: the first one stands
	if es.closed || es.end != nil || es.violation != nil || dup {
		es.mu.Unlock()
		sb.w.Close()
		return
	}
	sb.active = true
	if !sb.ended {
		es.subs[sb.room] = sb
	}
	for _, ev := range sb.pending {
		if !es.queueEventLocked(sb, ev) {
			break
		}
	}
	sb.pending = nil
	if sb.ended {
		es.endSubLocked(sb, sb.endErr)
	}
	es.mu.Unlock()
}

// Event implements kvmanager.WatchSink.
func (sb *engineSub) Event(ev kvmanager.RoomEvent) bool {
	es := sb.es
	es.mu.Lock()
	defer es.mu.Unlock()
	if !sb.active {
		sb.pending = append(sb.pending, ev)
		return true
	}
	return es.queueEventLocked(sb, ev)
}

// End implements kvmanager.WatchSink.
func (sb *engineSub) End(err error) {
	es := sb.es
	es.mu.Lock()
	defer es.mu.Unlock()
	sb.ended, sb.endErr = true, err
	if sb.active {
		es.endSubLocked(sb, err)
	}
}

// queueEventLocked queues one of sb's events; false when the queue is
// full (the stream is cut as a slow consumer). The room's last event
// leaves the subscription in the same step as it is queued: an Open of the
// room right after it subscribes it again (and gets its outcome) instead
// of finding it still subscribed.
func (es *engineSession) queueEventLocked(sb *engineSub, ev kvmanager.RoomEvent) bool {
	if ev.Seq <= sb.after {
		return true
	}
	// The last event: the one that says the room's pages are reusable (its
	// terminal event, or the step after it once a drain ended), or a
	// succeeded room's outcome.
	if ev.PagesReusable || (sb.outcome && !ev.Terminal) {
		es.forgetLocked(sb)
	}
	if es.end != nil || es.closed || es.violation != nil {
		return true // the stream ended: close() stops the watch
	}
	// The event's wire form is made by the sender, outside the room's lock.
	out := &pb.EngineEvent{Event: &pb.EngineEvent_Room{Room: &pb.EngineRoomEvent{Room: sb.room, Seq: ev.Seq}}}
	return es.pushLocked(out, ev, sb.resume && ev.Seq <= sb.last)
}

// endSubLocked ends sb's subscription: a watch that fell behind (the
// queue was full) cuts the stream as a slow consumer (the client resumes
// from the last seq it saw).
func (es *engineSession) endSubLocked(sb *engineSub, err error) {
	es.forgetLocked(sb)
	if errors.Is(err, kvmanager.ErrSlowConsumer) {
		es.failLocked(status.Errorf(codes.ResourceExhausted, "slow consumer: %d events queued", len(es.queue)))
	}
	signal(es.wake)
}

// forgetLocked takes sb off the stream's subscriptions.
func (es *engineSession) forgetLocked(sb *engineSub) {
	if !sb.removed && es.subs[sb.room] == sb {
		delete(es.subs, sb.room)
	}
	sb.removed = true
}

// packCount is how many of queue's first events go into the next message
// (at least one): at most MaxEngineEventsPerMessage, while their sizes add
// up to at most MaxSessionMessageBytes.
func packCount(queue []*pb.EngineEvent) int {
	n, bytes := 1, engineEventSize(queue[0])
	for n < min(len(queue), pb.MaxEngineEventsPerMessage) {
		b := engineEventSize(queue[n])
		if bytes+b > pb.MaxSessionMessageBytes {
			break
		}
		n, bytes = n+1, bytes+b
	}
	return n
}

// engineEventSize is an event's size for the packing budget: a reply's
// (which grows with its op's rooms) measured, a room event's bounded from
// above (a room's state without its pages and timeline).
func engineEventSize(ev *pb.EngineEvent) int {
	if r := ev.GetReply(); r != nil {
		return proto.Size(r)
	}
	return roomEventSizeBound
}

// roomEventSizeBound bounds an EngineRoomEvent's size on the wire from
// above for the packing budget.
const roomEventSizeBound = 4 << 10

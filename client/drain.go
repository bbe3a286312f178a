package client

import (
	"context"
	"errors"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// AckTimeout bounds the acknowledgement a hand-off sends when its room
// ended while it held the destination (best effort: the daemon releases
// the pages at its release.deferred_timeout anyway).
const AckTimeout = 5 * time.Second

// ackWait is how long a hand-off whose chunk revealed the room's failure
// waits for the claim stream's end (and its ack_required) before it gives
// up on acknowledging.
const ackWait = 2 * time.Second

// streamEnd is how a hand-off's claim stream ended.
type streamEnd struct {
	done bool
	err  error
}

// moveAndWait is handOff's second half: it moves every chunk with move while
// it watches the claim stream. When the stream ends the room with a failure
// that asks for an acknowledgement (ack_required), writing stops at once: the context of the write in flight
// (ReportRoom's Move) is cancelled and no further chunk is moved or reported. Once nothing writes any more, a
// rank the stream told to acknowledge (ack_required), or whose own chunk
// revealed the room's failure, sends AckRoomEnd (best effort, bounded by
// AckTimeout).
func (p *Prefill) moveAndWait(ctx, hctx context.Context, g *generation, room uint64, s claimStream, dest *pb.Destination,
	o SendOptions, tr handTransport, move func(ctx, writeCtx context.Context, ch Chunk, check func() error) error) (*pb.Destination, error) {
	mctx, stop := context.WithCancelCause(hctx)
	defer stop(nil)
	end := make(chan streamEnd, 1)
	got := false // the watcher's end was received
	defer func() {
		if !got { // the watcher ends with the stream: wait for it
			s.Close()
			<-end
		}
	}()
	go func() {
		for {
			ev, err := s.Next()
			if err != nil {
				if rf := (*RoomFailedError)(nil); errors.As(err, &rf) && rf.AckRequired {
					stop(err) // the room ended while this rank may write: stop writing
				}
				end <- streamEnd{err: err}
				return
			}
			if ev.Done != nil {
				end <- streamEnd{done: true}
				return
			}
			// Another destination cannot come on this claim (a rebootstrap
			// starts new claims after the room succeeded); skip it.
		}
	}()
	check := func() error {
		if err := p.check(g, room); err != nil {
			return err
		}
		if mctx.Err() != nil && hctx.Err() == nil {
			return context.Cause(mctx) // the claim stream ended the room
		}
		return nil
	}
	var moveErr error
	if !dest.GetDummy() {
		for _, ch := range chunks(dest, o.ChunkPages) {
			if moveErr = check(); moveErr != nil {
				break
			}
			if moveErr = move(hctx, mctx, ch, check); moveErr != nil {
				break
			}
		}
	}
	if moveErr == nil {
		e := <-end
		got = true
		if e.done {
			return dest, nil
		}
		p.ackIfOwed(ctx, tr, room, dest, e.err, false)
		return dest, p.voided(g, room, e.err)
	}
	// Nothing writes any more. The error as before: the stream's end when
	// it stopped the writes, else what the chunk revealed.
	var e streamEnd
	select {
	case e = <-end:
		got = true
	default:
	}
	if e.err != nil && (errors.Is(moveErr, e.err) || errors.Is(moveErr, context.Canceled)) {
		p.ackIfOwed(ctx, tr, room, dest, e.err, false)
		return dest, p.voided(g, room, e.err)
	}
	if v := p.voided(g, room, moveErr); errors.Is(v, ErrIncarnationChanged) {
		return dest, v
	}
	err := p.explain(ctx, room, moveErr)
	if errors.Is(err, ErrRoomFailed) && e.err == nil {
		t := time.NewTimer(ackWait)
		select {
		case e = <-end:
			got = true
		case <-t.C:
		}
		t.Stop()
	}
	p.ackIfOwed(ctx, tr, room, dest, e.err, errors.Is(err, ErrRoomFailed))
	return dest, err
}

// ackIfOwed sends AckRoomEnd when the stream's end (err) asked for it, or
// when failed (the room failed while this rank held its destination); its
// error is not the hand-off's (best effort).
func (p *Prefill) ackIfOwed(ctx context.Context, tr handTransport, room uint64, dest *pb.Destination, err error, failed bool) {
	var rf *RoomFailedError
	if !(errors.As(err, &rf) && rf.AckRequired) && !failed {
		return
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), AckTimeout)
	defer cancel()
	_ = tr.ack(actx, room, dest)
}

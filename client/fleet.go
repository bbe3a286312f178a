package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// RunHeartbeatFailover keeps one prefill rank alive in a fleet of decode
// daemons that share their registry (registry.backend etcd) until ctx
// ends, and returns ctx's error then. ps are the same rank's Prefill on
// several daemons of the fleet: the same registration, one Client each.
//
// It beats through one of them at a time (the current one, ps[0] first) at
// that Prefill's cadence (see RunHeartbeat), and moves to the next, at
// once, when a beat fails for its daemon rather than for the rank: the
// beat is ErrUnavailable or ErrDeadlineExceeded, or the daemon's
// incarnation changed since the last beat through it (it restarted: its
// rooms are gone). The first beat through a Prefill that has not
// registered registers it, and a daemon that answers ErrNotFound is
// registered with again (as RunHeartbeat does), so moving to a daemon that
// does not know the rank yet is safe. When every daemon failed in a row it
// waits one cadence before the next round. Each Prefill learns only its
// own daemon's incarnation: its destinations, and their hand-offs, stay
// bound to that daemon.
//
// Failed beats are passed to the failing Prefill's OnHeartbeatError, and
// so is an incarnation change that moved the loop on (an
// *IncarnationChangedError with both incarnations). Errors
// that repeating cannot fix (see RunHeartbeat) end the loop and are
// returned. It refuses (ErrInvalidArgument) no Prefill, a nil one, and
// Prefills of different ranks or instances. Do not run RunHeartbeat on the
// same Prefills meanwhile.
func RunHeartbeatFailover(ctx context.Context, ps ...*Prefill) error {
	if err := checkFailover(ps); err != nil {
		return err
	}
	cur := 0
	// seen[i] is ps[i]'s incarnation after the last beat through it since
	// the loop moved to it (0: none yet), to tell a daemon that restarted.
	seen := make([]uint64, len(ps))
	failed := 0 // daemons that failed in a row
	var next time.Duration
	if ps[cur].Registration() != nil {
		next = ps[cur].cadence()
	}
	t := time.NewTimer(next)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		p := ps[cur]
		err := p.beat(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		move := false
		if err == nil {
			inc := p.Incarnation()
			if old := seen[cur]; old != 0 && inc != old {
				move = true
				if p.onErr != nil {
					p.onErr(&IncarnationChangedError{Old: old, New: inc})
				}
			}
			seen[cur] = inc
		} else {
			if permanent(err) {
				return err
			}
			if p.onErr != nil {
				p.onErr(err)
			}
			move = failsDaemon(err)
		}
		next = p.cadence()
		switch {
		case !move:
			failed = 0
		default:
			seen[cur] = 0
			cur = (cur + 1) % len(ps)
			if failed++; failed < len(ps) {
				next = 0 // the first failed beat moves on at once
			} else {
				failed = 0 // every daemon failed: a cadence before the next round
			}
		}
		t.Reset(next)
	}
}

// failsDaemon reports a beat's error that is the daemon's, not the rank's:
// the daemon is unreachable, did not answer in time, or changed.
func failsDaemon(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrDeadlineExceeded) || errors.Is(err, ErrIncarnationChanged)
}

// checkFailover refuses what RunHeartbeatFailover cannot run: no Prefill,
// a nil one, or Prefills that are not one rank of one instance.
func checkFailover(ps []*Prefill) error {
	const op = "RunHeartbeatFailover"
	if len(ps) == 0 {
		return localError(op, codes.InvalidArgument, "no Prefill: give the rank's Prefill on each daemon of the fleet")
	}
	for i, p := range ps {
		if p == nil {
			return localError(op, codes.InvalidArgument, "Prefill %d is nil", i)
		}
		if !proto.Equal(p.rank, ps[0].rank) || p.reg.GetInstanceId() != ps[0].reg.GetInstanceId() {
			return localError(op, codes.InvalidArgument, "Prefill %d is rank %v of instance %q, Prefill 0 rank %v of instance %q: give one rank's Prefill per daemon",
				i, p.rank, p.reg.GetInstanceId(), ps[0].rank, ps[0].reg.GetInstanceId())
		}
	}
	return nil
}

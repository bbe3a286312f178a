package client

import (
	"context"
	"errors"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// generation is one daemon incarnation as a Prefill holds it: void is
// cancelled (with an *IncarnationChangedError as its cause) once the
// Prefill learned another incarnation.
type generation struct {
	inc  uint64 // guarded by Prefill.mu; 0 until known (bound by the first learn)
	ctx  context.Context
	void context.CancelCauseFunc
}

func newGeneration(inc uint64) *generation {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &generation{inc: inc, ctx: ctx, void: cancel}
}

// Incarnation returns the daemon incarnation the rank holds (from its last
// registration or heartbeat), 0 until one is known.
func (p *Prefill) Incarnation() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen == nil {
		return 0
	}
	return p.gen.inc
}

// generation returns the current generation, made (unbound) if none is.
func (p *Prefill) generation() *generation {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen == nil {
		p.gen = newGeneration(0)
	}
	return p.gen
}

// incOf reads g's incarnation.
func (p *Prefill) incOf(g *generation) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return g.inc
}

// learn records the daemon's incarnation inc (0: nothing known). Another
// one than the Prefill holds voids every destination of the old one;
// unless it came from Register, the next beat registers again.
func (p *Prefill) learn(inc uint64, registered bool) {
	if inc == 0 {
		return
	}
	p.mu.Lock()
	var old uint64
	switch g := p.gen; {
	case g == nil:
		p.gen = newGeneration(inc)
	case g.inc == 0:
		g.inc = inc
	case g.inc != inc:
		old = g.inc
		g.void(&IncarnationChangedError{Old: g.inc, New: inc})
		p.gen = newGeneration(inc)
		if !registered {
			p.reregister = true
		}
	}
	if registered {
		p.reregister = false
	}
	p.mu.Unlock()
	if old != 0 && p.onInc != nil {
		p.onInc(old, inc)
	}
}

// check is called right before every write and report of a hand-off bound
// to g: it fails once g is void. Taken under p.mu, it fails for every check
// made after learn returned; a write whose check passed just before is sent
// with the hand-off's context, which learn cancelled, and the daemon refuses
// it by its incarnation in any case.
func (p *Prefill) check(g *generation, room uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g.ctx.Err() != nil {
		return p.changed(g, room, nil)
	}
	return nil
}

// changed is g's void cause, for room, wrapping err.
func (p *Prefill) changed(g *generation, room uint64, err error) error {
	ic := &IncarnationChangedError{Room: room, Old: g.inc, Err: err}
	var cause *IncarnationChangedError
	if errors.As(context.Cause(g.ctx), &cause) {
		ic.New = cause.New
	}
	return ic
}

// voided turns a hand-off's error into an *IncarnationChangedError when the
// incarnation changed: the error says so (a STALE_INCARNATION refusal, a
// destination of another incarnation), or g was voided meanwhile. It
// learns the daemon's incarnation from the error.
func (p *Prefill) voided(g *generation, room uint64, err error) error {
	var ic *IncarnationChangedError
	if errors.As(err, &ic) {
		p.learn(ic.New, false)
		out := *ic
		out.Room = room
		return &out
	}
	if _, daemon, ok := StaleIncarnation(err); ok {
		p.learn(daemon, false)
		p.mu.Lock()
		defer p.mu.Unlock()
		return &IncarnationChangedError{Room: room, Old: g.inc, New: daemon, Err: err}
	}
	if g.ctx.Err() != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.changed(g, room, err)
	}
	return err
}

// bind binds a hand-off of g to its destination's incarnation: a g not
// bound yet takes it; a destination of another incarnation than g's means
// the daemon changed (learned: g is void) and nothing is written.
func (p *Prefill) bind(g *generation, room uint64, dest *pb.Destination) error {
	inc := dest.GetIncarnation()
	if inc == 0 {
		return nil // a daemon older than incarnations
	}
	p.mu.Lock()
	old := g.inc
	if old == 0 && p.gen == g {
		g.inc = inc
	}
	p.mu.Unlock()
	if old == 0 || old == inc {
		return p.check(g, room)
	}
	p.learn(inc, false)
	return &IncarnationChangedError{Room: room, Old: old, New: inc}
}

package delegate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// The decode engine's layouts at the agent. A decode rank's layout is
// registered (its buffers mapped by the agent, in the engine's memory),
// dropped (the agent refused its buffers on a health check: the engine
// exited and its memory is gone or was replaced; released once the agent
// forgot the old buffers), or replaced by a later RegisterLayout, which
// releases the old buffers first. A chunk copies only into the exact
// layout its room was declared with, and only while it is registered.

// rankLayout is one decode rank's layout at the agent.
type rankLayout struct {
	layout *kvlayout.BufferLayout
	specs  []kvcopy.BufferSpec
	// dropped is why the agent no longer holds the buffers for the
	// engine; "" while they are registered.
	dropped string
	// released: the agent forgot the buffers (deregistered).
	released bool
	// changing: RegisterLayout is releasing the buffers; no batch starts.
	changing bool
	// inflight counts the batches into these buffers being executed.
	inflight int
}

func (r *rankLayout) names() []string {
	out := make([]string, len(r.specs))
	for i, s := range r.specs {
		out[i] = s.Name
	}
	return out
}

// lockReg takes the registration token, or fails when ctx ends first.
func (e *DelegateEngine) lockReg(ctx context.Context) error {
	select {
	case e.reg <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (e *DelegateEngine) unlockReg() { <-e.reg }

// agentErr maps an agent call's error: unreachable (or no answer within
// the call's bound, rctx's deadline) marks the agent down and is
// transfer.ErrEngineUnavailable; a refusal keeps the agent's reason.
func (e *DelegateEngine) agentErr(ctx, rctx context.Context, what string, err error) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(rctx.Err(), context.DeadlineExceeded):
		err = fmt.Errorf("%w: no answer within transfer.delegate.batch_timeout (%s)", ErrAgentUnreachable, e.cfg.BatchTimeout)
	case !isUnreachable(err):
		return fmt.Errorf("the transfer agent refused to %s: %w", what, refusal{err})
	}
	e.markDown(err)
	return fmt.Errorf("%w: %s: %v", transfer.ErrEngineUnavailable, what, err)
}

// RegisterLayout implements transfer.LayoutRegistrar: it registers the
// layout's buffers with the agent (all or none, in the engine's memory;
// each agent call bounded by transfer.delegate.batch_timeout) and keeps
// them, registered again on every health check. The rank's registered
// layout, equal to l, is confirmed with the agent (already; refused when
// the engine's memory was replaced, then released and registered anew).
// A rank that had another layout, or one dropped, has its old buffers
// released first: refused while copies into them are in flight (the
// daemon's own, or the agent's refusal). An agent that cannot be reached
// is transfer.ErrEngineUnavailable; a refusal is returned with the agent's
// reason.
func (e *DelegateEngine) RegisterLayout(ctx context.Context, dp, tp int, l *kvlayout.BufferLayout) (bool, error) {
	if err := e.lockReg(ctx); err != nil {
		return false, err
	}
	defer e.unlockReg()
	if up, reason := e.Ready(); !up {
		return false, fmt.Errorf("%w: %s", transfer.ErrEngineUnavailable, reason)
	}
	k := [2]int{dp, tp}
	specs := layoutSpecs(l)
	e.mu.Lock()
	prev := e.layouts[k]
	same := prev != nil && prev.dropped == "" && prev.layout.Equal(l)
	e.mu.Unlock()
	if same {
		rctx, cancel := context.WithTimeout(ctx, max(e.cfg.BatchTimeout, time.Second))
		err := e.agent.RegisterBuffers(rctx, specs)
		cancel()
		if err == nil {
			return true, nil
		}
		if err = e.agentErr(ctx, rctx, "register the decode engine's buffers", err); !errors.As(err, new(refusal)) {
			return false, err
		}
		e.log.Info("the decode engine registered its layout again in other memory: the old buffers are released", "decode_dp", dp, "decode_tp", tp, "reason", err)
	}
	wasRegistered, err := e.releaseLayout(ctx, k, prev)
	if err != nil {
		return false, err
	}
	if len(specs) > 0 {
		rctx, cancel := context.WithTimeout(ctx, max(e.cfg.BatchTimeout, time.Second))
		err := e.agent.RegisterBuffers(rctx, specs)
		cancel()
		if err != nil {
			err = e.agentErr(ctx, rctx, fmt.Sprintf("register the decode engine's buffers of decode rank (dp %d, tp %d)", dp, tp), err)
			if wasRegistered && !errors.Is(err, transfer.ErrEngineUnavailable) {
				e.restore(ctx, prev, err)
			}
			return false, err
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(specs) == 0 {
		delete(e.layouts, k)
	} else {
		e.layouts[k] = &rankLayout{layout: l, specs: specs}
	}
	return false, nil
}

// refusal is the agent's refusal of a registration or deregistration
// (an error that is not ErrAgentUnreachable).
type refusal struct{ error }

func (r refusal) Unwrap() error { return r.error }

// releaseLayout deregisters prev's buffers at the agent (a rank with no
// layout, or one released already, has nothing to release); wasRegistered:
// prev was registered until then. Refused while batches of the daemon
// into prev's buffers are running (one built before prev was dropped
// would land in the new layout's memory when it names the same buffers);
// the agent refuses while copies into them are in flight. Under the
// registration token.
func (e *DelegateEngine) releaseLayout(ctx context.Context, k [2]int, prev *rankLayout) (wasRegistered bool, err error) {
	if prev == nil {
		return false, nil
	}
	e.mu.Lock()
	if prev.inflight > 0 {
		n := prev.inflight
		e.mu.Unlock()
		return false, fmt.Errorf("release the buffers of decode rank (dp %d, tp %d)'s previous layout: %d batches of copies into them are in flight; register again once they completed",
			k[0], k[1], n)
	}
	if prev.released {
		e.mu.Unlock()
		return false, nil
	}
	wasRegistered = prev.dropped == ""
	prev.changing = true
	e.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, max(e.cfg.BatchTimeout, time.Second))
	err = e.agent.DeregisterBuffers(rctx, prev.names())
	cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	prev.changing = false
	if err != nil {
		return false, e.agentErr(ctx, rctx, fmt.Sprintf("release the buffers of decode rank (dp %d, tp %d)'s previous layout", k[0], k[1]), err)
	}
	prev.released = true
	if wasRegistered {
		prev.dropped = "released for a new registration"
	}
	return wasRegistered, nil
}

// restore registers prev's buffers again after a new layout was refused
// in their place, so that the rank keeps its layout (all or nothing); when
// that fails too (the engine's old memory is gone), prev stays dropped.
// Under the registration token.
func (e *DelegateEngine) restore(ctx context.Context, prev *rankLayout, cause error) {
	rctx, cancel := context.WithTimeout(ctx, max(e.cfg.BatchTimeout, time.Second))
	err := e.agent.RegisterBuffers(rctx, prev.specs)
	cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil {
		prev.released, prev.dropped = false, ""
		return
	}
	prev.dropped = capReason(fmt.Sprintf("released for a layout the transfer agent refused (%v), and refused again (%v)", cause, err))
}

// maxReason bounds a dropped layout's reason (GetStatus reports it).
const maxReason = 1024

func capReason(s string) string {
	if len(s) <= maxReason {
		return s
	}
	return strings.ToValidUTF8(s[:maxReason-3], "") + "..."
}

// LayoutDropped implements transfer.LayoutRegistrar.
func (e *DelegateEngine) LayoutDropped(dp, tp int) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.layouts[[2]int{dp, tp}]; r != nil {
		return r.dropped
	}
	return ""
}

// probeLayouts registers each decode rank's layout again (the health
// check's; the agent may have restarted) and releases the buffers of the
// dropped ones. The agent unreachable is returned; a layout it refuses is
// dropped. While a registration is in progress (it talks to the agent
// itself) the layouts are left to the next check.
func (e *DelegateEngine) probeLayouts(ctx context.Context) error {
	select {
	case e.reg <- struct{}{}:
	default:
		return nil
	}
	defer e.unlockReg()
	e.mu.Lock()
	keys := make([][2]int, 0, len(e.layouts))
	for k := range e.layouts {
		keys = append(keys, k)
	}
	e.mu.Unlock()
	slices.SortFunc(keys, func(a, b [2]int) int { return (a[0]-b[0])<<16 + a[1] - b[1] })
	for _, k := range keys {
		e.mu.Lock()
		r := e.layouts[k]
		if r == nil {
			e.mu.Unlock()
			continue
		}
		dropped, released := r.dropped != "", r.released
		e.mu.Unlock()
		var err error
		switch {
		case !dropped:
			if err = e.agent.RegisterBuffers(ctx, r.specs); err != nil && !isUnreachable(err) && ctx.Err() == nil {
				e.drop(k, r, err)
				err = e.agent.DeregisterBuffers(ctx, r.names())
				e.markReleased(r, err)
			}
		case !released:
			err = e.agent.DeregisterBuffers(ctx, r.names())
			e.markReleased(r, err)
		}
		if err != nil && (isUnreachable(err) || ctx.Err() != nil) {
			return fmt.Errorf("register the decode engine's buffers of decode rank (dp %d, tp %d): %w", k[0], k[1], err)
		}
	}
	return nil
}

// drop records that the agent refused r's buffers, and says so once.
func (e *DelegateEngine) drop(k [2]int, r *rankLayout, err error) {
	e.mu.Lock()
	r.dropped = capReason(fmt.Sprintf("the transfer agent refused its buffers on a health check: %v", err))
	e.mu.Unlock()
	e.log.Warn("decode engine layout dropped: the transfer agent refused its buffers (the decode engine exited: its memory is gone or was replaced); rooms declared in it fail",
		"decode_dp", k[0], "decode_tp", k[1], "layout_id", fmt.Sprintf("%016x", r.layout.ID()), "reason", err,
		"fix", "the decode engine registers its layout again (Rooms.RegisterEngineLayout)")
}

// markReleased records a dropped layout's deregistration (err nil); one
// refused (copies in flight) is tried again on the next health check.
func (e *DelegateEngine) markReleased(r *rankLayout, err error) {
	if err != nil {
		e.log.Debug("could not release a dropped decode engine layout's buffers at the transfer agent; trying again on the next health check", "err", err)
		return
	}
	e.mu.Lock()
	r.released = true
	e.mu.Unlock()
}

// useLayouts checks that the op's layouts are its ranks' registered ones
// and counts a batch into them in flight until done is called. A room of
// a dropped or replaced layout fails (transfer.ErrTransferFailed).
func (e *DelegateEngine) useLayouts(op transfer.ChunkOp) (done func(), err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	var used []*rankLayout
	for _, t := range op.Targets {
		if t.Dummy || t.DecodeTP < 0 || t.DecodeTP >= len(op.Engine) || op.Engine[t.DecodeTP] == nil {
			continue // layoutBatch says why
		}
		k := [2]int{op.DecodeDP, t.DecodeTP}
		r := e.layouts[k]
		why := ""
		switch {
		case r == nil || r.layout != op.Engine[t.DecodeTP]:
			why = "was replaced: the decode engine registered its layout again after the room was declared"
		case r.changing:
			why = "is being replaced: the decode engine is registering its layout again"
		case r.dropped != "":
			why = "was dropped (" + r.dropped + ")"
		}
		if why != "" {
			return nil, fmt.Errorf("%w: room %d: decode rank (dp %d, tp %d)'s buffer layout, which the room was declared in, %s: the room's bytes have nowhere to land",
				transfer.ErrTransferFailed, op.Room, k[0], k[1], why)
		}
		if !slices.Contains(used, r) {
			used = append(used, r)
		}
	}
	for _, r := range used {
		r.inflight++
	}
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, r := range used {
			r.inflight--
		}
	}, nil
}

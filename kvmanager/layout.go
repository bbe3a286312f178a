package kvmanager

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// The decode engine's buffer layouts (kv_pool.owner: engine): the engine
// registers, per decode rank, the buffers it keeps a room's KV, aux rows
// and state in (RegisterEngineLayout); the rooms declared on a shard
// afterwards are weighed and copied by them (transfer.LayoutWeights, the
// delegated engine's copies), and keep the layouts they were declared with.
// A shard's layouts are all or none: a declaration on a shard where some
// TP ranks registered one and others not is refused. A registration is
// refused while a hand-off of its shard holds pages (a room's bytes would
// move under a layout it was not declared with); the same layout again is
// accepted (already) once the engine confirmed it (the delegated engine:
// its agent still maps the same memory). An engine may drop a layout (the
// delegated engine: its agent refused the buffers, the decode engine's
// memory is gone); a declaration on the shard is refused until the engine
// registers it again, and the rooms declared before keep the dropped
// layout, whose chunks fail.

// layoutBook serializes registrations (one at a time: the engine's own
// registration at the transfer agent is a network call made between the
// check and the change) and holds each shard's layouts in the shard.
type layoutBook struct {
	mu sync.Mutex
	// check is the engine's check of a chunk of a room with layouts
	// (transfer.OpChecker; nil: the engine has none).
	check func(transfer.ChunkOp) error
}

// ErrLayoutChanging: a declaration on a shard whose layout is being
// registered. FailedPrecondition; declare again.
var ErrLayoutChanging = errors.New("the decode engine's buffer layout of this shard is being registered")

// RegisteredLayout is one decode rank's registered layout.
type RegisteredLayout struct {
	DecodeDP, DecodeTP int
	Layout             *kvlayout.BufferLayout
	// Dropped is why the engine dropped the layout (its memory is gone);
	// "" while it is registered.
	Dropped string
}

// RegisterEngineLayout registers the buffer layout of decode rank (dp, tp)
// (kv_pool.owner: engine): checked against kv_pool (l.Validate, a name of
// another rank's layout is refused too), registered with the transfer
// engine (the delegated engine registers the buffers with its agent, in
// the engine's memory), then used by the rooms declared on the shard from
// then on. The same layout again answers already, unless the engine says
// it registered it anew (it had dropped it, or its memory was replaced):
// then the rooms declared before keep the old one, whose chunks fail.
// Refused with ErrWrongState: the daemon owns the pages, staging is on
// (the staged path scatters into decodeplane's own layout), or the shard
// has hand-offs in flight and the layout differs. The layout is kept as
// given: the caller must not change it afterwards.
func (m *Manager) RegisterEngineLayout(ctx context.Context, dp, tp int, l *kvlayout.BufferLayout) (already bool, err error) {
	switch {
	case m.dec.Pool.Owner != kvlayout.OwnerEngine:
		return false, fmt.Errorf("register engine layout: %w: kv_pool.owner is daemon: decodeplane's own page-major buffers are the layout; set kv_pool.owner: engine for an engine that allocates its pages in buffers of its own", ErrWrongState)
	case m.dec.Staging.Enabled:
		return false, fmt.Errorf("register engine layout: %w: staging.enabled is true: the staged path scatters into decodeplane's own page-major buffers; set staging.enabled: false to register the engine's layout", ErrWrongState)
	case dp < 0 || dp >= len(m.shards):
		return false, invalid("decode_dp_rank", "%d is out of range: this daemon hosts %d decode DP shards (allowed 0..%d)", dp, len(m.shards), len(m.shards)-1)
	case tp < 0 || tp >= m.layout.AttnTP:
		return false, invalid("decode_tp_rank", "%d is out of range: parallel.attn_tp is %d (allowed 0..%d)", tp, m.layout.AttnTP, m.layout.AttnTP-1)
	case l == nil:
		return false, invalid("layout", "is required")
	}
	if err := l.Validate(m.dec); err != nil {
		return false, err
	}
	m.layouts.mu.Lock()
	defer m.layouts.mu.Unlock()
	if err := m.checkLayoutNames(dp, tp, l); err != nil {
		return false, err
	}
	lr, _ := m.engine.(transfer.LayoutRegistrar)
	sh := m.shards[dp]
	sh.mu.Lock()
	same := sh.layoutOf(tp).Equal(l)
	if same && lr == nil {
		sh.mu.Unlock()
		return true, nil
	}
	if st := sh.holds.Stats(); st.Held > 0 && !same {
		sh.mu.Unlock()
		return false, fmt.Errorf("register engine layout of decode rank (dp %d, tp %d): %w: %d hand-offs of the shard hold pages (declared and not ended, %d draining): their bytes would move under a layout they were not declared with; register it once they ended",
			dp, tp, ErrWrongState, st.Held, st.Draining)
	}
	sh.layoutChanging = true
	sh.mu.Unlock()
	if lr != nil {
		already, err = lr.RegisterLayout(ctx, dp, tp, l)
		already = already && same
		if err != nil && !errors.Is(err, transfer.ErrEngineUnavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %v", ErrWrongState, err)
		}
	}
	sh.mu.Lock()
	sh.layoutChanging = false
	if err == nil && !already {
		next := slices.Clone(sh.layouts)
		if next == nil {
			next = make([]*kvlayout.BufferLayout, m.layout.AttnTP)
		}
		next[tp] = l
		sh.layouts = next
	}
	sh.mu.Unlock()
	if err == nil && !already {
		m.log.Info("decode engine layout registered", "decode_dp", dp, "decode_tp", tp, "layout_id", fmt.Sprintf("%016x", l.ID()),
			"kv_buffers", len(l.KV), "aux_buffers", len(l.Aux), "state_buffers", len(l.State), "marker", l.Marker)
	}
	return already, err
}

// layoutDropped is why the engine dropped decode rank (dp, tp)'s layout,
// or "".
func (m *Manager) layoutDropped(dp, tp int) string {
	if lr, ok := m.engine.(transfer.LayoutRegistrar); ok {
		return lr.LayoutDropped(dp, tp)
	}
	return ""
}

// checkLayoutNames refuses a name another decode rank's layout has (the
// agent knows every buffer by its name alone). Under m.layouts.mu.
func (m *Manager) checkLayoutNames(dp, tp int, l *kvlayout.BufferLayout) error {
	mine := map[string]string{}
	for i, n := range l.Names() {
		mine[n] = layoutField(l, i)
	}
	for d, sh := range m.shards {
		for t, o := range sh.layouts { // written under m.layouts.mu too
			if o == nil || (d == dp && t == tp) {
				continue
			}
			for _, n := range o.Names() {
				if f, ok := mine[n]; ok {
					return invalid(f, "%q is a buffer of decode rank (dp %d, tp %d)'s layout: every decode rank names its own buffers", n, d, t)
				}
			}
		}
	}
	return nil
}

// layoutField names buffer i of l.Names() as a request field.
func layoutField(l *kvlayout.BufferLayout, i int) string {
	switch {
	case i < len(l.KV):
		return fmt.Sprintf("layout.kv[%d].name", i)
	case i < len(l.KV)+len(l.Aux):
		return fmt.Sprintf("layout.aux[%d].name", i-len(l.KV))
	}
	return fmt.Sprintf("layout.state[%d].name", i-len(l.KV)-len(l.Aux))
}

// layoutOf is decode TP rank tp's layout (nil: none). Under sh.mu.
func (sh *shard) layoutOf(tp int) *kvlayout.BufferLayout {
	if tp < len(sh.layouts) {
		return sh.layouts[tp]
	}
	return nil
}

// declLayouts are the layouts a room declared on the shard now keeps: all
// TP ranks', or nil when none registered. A shard where only some did,
// whose layout is being registered, or one the engine dropped (dropped:
// why, by TP rank), refuses the declaration. Under sh.mu.
func (sh *shard) declLayouts(dropped func(dp, tp int) string) ([]*kvlayout.BufferLayout, error) {
	if sh.layoutChanging {
		return nil, fmt.Errorf("declare destination: %w (decode DP shard %d): declare again once RegisterEngineLayout answered", ErrLayoutChanging, sh.idx)
	}
	var missing []string
	n := 0
	for tp, l := range sh.layouts {
		if l == nil {
			missing = append(missing, fmt.Sprint(tp))
		} else {
			n++
		}
	}
	switch {
	case n == 0:
		return nil, nil
	case len(missing) > 0:
		return nil, fmt.Errorf("declare destination: %w: decode DP shard %d has the engine's buffer layout for %d of its TP ranks, not for tp %s: register every TP rank's layout (RegisterEngineLayout) before declaring",
			ErrWrongState, sh.idx, n, strings.Join(missing, ", "))
	}
	for tp := range sh.layouts {
		if why := dropped(sh.idx, tp); why != "" {
			return nil, fmt.Errorf("declare destination: %w: the decode engine's buffer layout of decode rank (dp %d, tp %d) was dropped (%s): the decode engine registers its layout again (RegisterEngineLayout) before declaring",
				ErrWrongState, sh.idx, tp, why)
		}
	}
	return sh.layouts, nil
}

// EngineLayouts lists every registered layout, by decode DP then TP rank.
func (m *Manager) EngineLayouts() []RegisteredLayout {
	var out []RegisteredLayout
	for d, sh := range m.shards {
		sh.mu.Lock()
		ls := sh.layouts
		sh.mu.Unlock()
		for t, l := range ls {
			if l != nil {
				out = append(out, RegisteredLayout{DecodeDP: d, DecodeTP: t, Layout: l, Dropped: m.layoutDropped(d, t)})
			}
		}
	}
	return out
}

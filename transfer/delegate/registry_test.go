package delegate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// The decode engine's layouts at the agent across the engine's restarts:
// the health check drops a layout the agent refuses without making the
// daemon unready, and a registration releases the rank's old buffers
// first. The agent is the in-process reference agent; faultAgent injects
// the refusals.

// faultAgent is the in-process agent with injected faults: refuse fails a
// registration that holds a buffer it names, deregErr fails every
// deregistration, unreachable fails registrations of names with its
// prefix as an unreachable agent would; calls records the
// (de)registrations in order.
type faultAgent struct {
	*hostmem.Agent
	mu          sync.Mutex
	refuse      func(name string) error
	deregErr    error
	unreachable string
	calls       []string
	// hold blocks a registration naming buffer holdName until it is closed.
	hold     chan struct{}
	holdName string
}

func (f *faultAgent) set(fn func(*faultAgent)) { f.mu.Lock(); defer f.mu.Unlock(); fn(f) }

func (f *faultAgent) RegisterBuffers(ctx context.Context, bufs []kvcopy.BufferSpec) error {
	f.mu.Lock()
	refuse, unreachable, hold := f.refuse, f.unreachable, f.hold
	if bufs[0].Name != f.holdName {
		hold = nil
	}
	f.calls = append(f.calls, "register "+bufs[0].Name)
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, b := range bufs {
		if unreachable != "" && strings.HasPrefix(b.Name, unreachable) {
			return fmt.Errorf("%w: connection refused", delegate.ErrAgentUnreachable)
		}
		if refuse != nil {
			if err := refuse(b.Name); err != nil {
				return err
			}
		}
	}
	return f.Agent.RegisterBuffers(ctx, bufs)
}

func (f *faultAgent) DeregisterBuffers(ctx context.Context, names []string) error {
	f.mu.Lock()
	err := f.deregErr
	f.calls = append(f.calls, "deregister "+names[0])
	f.mu.Unlock()
	if err != nil {
		return err
	}
	return f.Agent.DeregisterBuffers(ctx, names)
}

func (f *faultAgent) log() []string { f.mu.Lock(); defer f.mu.Unlock(); return slices.Clone(f.calls) }

// warnings counts the WARN records whose message contains a word.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var attrs []string
	r.Attrs(func(a slog.Attr) bool { attrs = append(attrs, a.String()); return true })
	w.msgs = append(w.msgs, r.Message+" "+strings.Join(attrs, " "))
	return nil
}
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnings) WithGroup(string) slog.Handler      { return w }
func (w *warnings) with(word string) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, m := range w.msgs {
		if strings.Contains(m, word) {
			out = append(out, m)
		}
	}
	return out
}

// layoutRig is a running engine with decode TP 2's two layouts
// registered, and prefill rank buffers "p/<r>" holding pages 1 and 2.
type layoutRig struct {
	eng  *delegate.DelegateEngine
	ag   *faultAgent
	rd   *readiness
	warn *warnings
	dec  kvlayout.Config
	els  []*kvlayout.BufferLayout
}

const rigInterval = time.Second

func newLayoutRig(t *testing.T) *layoutRig {
	t.Helper()
	dec := layoutDecode(t, 2, kvlayout.KindGQA)
	r := &layoutRig{ag: &faultAgent{Agent: hostmem.NewAgent(hostmem.New(0))}, rd: newReadiness(), warn: &warnings{}, dec: dec, els: engineLayouts(dec)}
	r.eng = delegate.NewDelegateEngine(delegate.DelegateConfig{Target: "agent", BatchTimeout: 5 * time.Second, HealthInterval: rigInterval}, r.ag,
		delegate.DelegateDeps{Buffers: kvcopy.DecodeBuffers(dec.Layout(), 0, 24), OnReadiness: r.rd.on, Logger: slog.New(r.warn)})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = r.eng.Run(ctx) }()
	if up := <-r.rd.ch; !up {
		t.Fatal("the engine is not ready")
	}
	for tp, el := range r.els {
		if already, err := r.eng.RegisterLayout(context.Background(), 0, tp, el); err != nil || already {
			t.Fatalf("RegisterLayout(tp %d) = %v, already %v", tp, err, already)
		}
		l := dec.Layout()
		fillLayoutPrefill(t, r.ag.Store(), l, el, fmt.Sprintf("p/%d", tp), tp, l.HeadsPerRank, 1, 0, []int32{1, 2}, 2)
	}
	return r
}

// chunk is prefill rank r's first chunk (2 pages) of a room declared in
// layouts els (TP 2 to TP 2: rank r writes decode rank r).
func (r *layoutRig) chunk(rank int, els []*kvlayout.BufferLayout) transfer.ChunkOp {
	l := r.dec.Layout()
	return transfer.ChunkOp{Room: 40 + uint64(rank), Rank: transfer.Rank{TP: rank}, DestPages: []int32{7, 8}, SrcPages: []int32{1, 2}, Tokens: 2 * l.PageSize,
		SrcBuffer: fmt.Sprintf("p/%d", rank), SrcAuxRow: -1, Targets: headTargets(l, 2, rank), Layout: l, PrefillTP: 2, PrefillPP: 1, Engine: els}
}

func (r *layoutRig) registered(name string) bool {
	_, err := r.ag.Store().Read(name, 0, 1)
	return err == nil
}

// TestHealthCheckDropsRefusedLayout: the engine of decode rank tp 1 exits
// (the agent refuses its buffers): the health check drops that layout
// only — said once in a WARN naming the rank, the reason and the fix, its
// buffers released at the agent — and the daemon stays ready; a chunk
// into it fails saying why, one into tp 0's lands; registering it again
// makes it the rank's layout.
func TestHealthCheckDropsRefusedLayout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newLayoutRig(t)
		gone := errors.New(`in shared memory /dev/shm/e1 at offset 0: buffer registered in other memory: the file at /dev/shm/e1 is not the one registered (it was replaced since); deregister the buffer first`)
		r.ag.set(func(f *faultAgent) {
			f.refuse = func(n string) error {
				if strings.HasPrefix(n, "e1/") {
					return gone
				}
				return nil
			}
		})
		time.Sleep(3 * rigInterval)
		synctest.Wait()
		if up, why := r.eng.Ready(); !up || len(r.rd.changes) != 1 {
			t.Fatalf("Ready = %v (%s), readiness changes %v; want ready throughout", up, why, r.rd.changes)
		}
		if d := r.eng.LayoutDropped(0, 1); !strings.Contains(d, "replaced since") {
			t.Errorf("LayoutDropped(0, 1) = %q; want the agent's reason", d)
		}
		if d := r.eng.LayoutDropped(0, 0); d != "" {
			t.Errorf("LayoutDropped(0, 0) = %q; want registered", d)
		}
		w := r.warn.with("layout dropped")
		if len(w) != 1 || !strings.Contains(w[0], "decode_tp=1") || !strings.Contains(w[0], "replaced since") || !strings.Contains(w[0], "registers its layout again") {
			t.Errorf("WARN lines = %q; want one naming decode_tp=1, the reason and the fix", w)
		}
		if r.registered(r.els[1].KV[0].Name) || !r.registered(r.els[0].KV[0].Name) {
			t.Error("the dropped layout's buffers are still registered at the agent, or the other layout's are not")
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(1, r.els)); !errors.Is(err, transfer.ErrTransferFailed) || !strings.Contains(err.Error(), "was dropped") {
			t.Errorf("a chunk into the dropped layout = %v; want ErrTransferFailed saying it was dropped", err)
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(0, r.els)); err != nil {
			t.Errorf("a chunk into the registered layout: %v", err)
		}
		// The engine restarted: it registers the same layout again.
		r.ag.set(func(f *faultAgent) { f.refuse = nil })
		again := *r.els[1]
		if already, err := r.eng.RegisterLayout(context.Background(), 0, 1, &again); err != nil || already {
			t.Fatalf("RegisterLayout of the dropped layout = %v, already %v; want registered anew", err, already)
		}
		if d := r.eng.LayoutDropped(0, 1); d != "" || !r.registered(r.els[1].KV[0].Name) {
			t.Errorf("after registering again: dropped %q, registered %v", d, r.registered(r.els[1].KV[0].Name))
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(1, r.els)); !errors.Is(err, transfer.ErrTransferFailed) || !strings.Contains(err.Error(), "was replaced") {
			t.Errorf("a chunk of a room declared before the registration = %v; want it failed: its layout was replaced", err)
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(1, []*kvlayout.BufferLayout{r.els[0], &again})); err != nil {
			t.Errorf("a chunk of a room declared in the new registration: %v", err)
		}
		time.Sleep(2 * rigInterval)
		synctest.Wait()
		if w := r.warn.with("layout dropped"); len(w) != 1 {
			t.Errorf("%d WARN lines about dropped layouts; want the one", len(w))
		}
	})
}

// TestHealthCheckUnreachableMarksDown: the agent unreachable while the
// health check registers a layout makes the daemon unready and drops
// nothing.
func TestHealthCheckUnreachableMarksDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newLayoutRig(t)
		r.ag.set(func(f *faultAgent) { f.unreachable = "e1/" })
		time.Sleep(rigInterval)
		synctest.Wait()
		if up, why := r.eng.Ready(); up || !strings.Contains(why, "unreachable") {
			t.Errorf("Ready = %v (%s); want not ready, the agent unreachable", up, why)
		}
		if d := r.eng.LayoutDropped(0, 1); d != "" {
			t.Errorf("LayoutDropped(0, 1) = %q; an unreachable agent drops nothing", d)
		}
		r.ag.set(func(f *faultAgent) { f.unreachable = "" })
		time.Sleep(rigInterval)
		synctest.Wait()
		if up, _ := r.eng.Ready(); !up {
			t.Error("not ready again once the agent answers")
		}
	})
}

// TestRegisterLayoutReleasesOldFirst: a rank's new layout — here the same
// names with other lengths, which the agent refuses while it knows the
// old ones — is registered after the old buffers were released; the same
// layout again is already and releases nothing.
func TestRegisterLayoutReleasesOldFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newLayoutRig(t)
		before := len(r.ag.log())
		same := *r.els[0]
		if already, err := r.eng.RegisterLayout(context.Background(), 0, 0, &same); err != nil || !already {
			t.Fatalf("the same layout again = %v, already %v; want already", err, already)
		}
		if got := r.ag.log()[before:]; len(got) != 1 || !strings.HasPrefix(got[0], "register ") {
			t.Errorf("the same layout again made %q; want one registration (the agent confirms it)", got)
		}
		bigger := growLayout(r.els[0])
		before = len(r.ag.log())
		if already, err := r.eng.RegisterLayout(context.Background(), 0, 0, bigger); err != nil || already {
			t.Fatalf("RegisterLayout of a new layout = %v, already %v", err, already)
		}
		got := r.ag.log()[before:]
		if len(got) != 2 || got[0] != "deregister "+r.els[0].KV[0].Name || got[1] != "register "+bigger.KV[0].Name {
			t.Errorf("agent calls %q; want the old buffers deregistered, then the new ones registered", got)
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(0, r.els)); err == nil || !strings.Contains(err.Error(), "was replaced") {
			t.Errorf("a chunk in the replaced layout = %v; want it failed", err)
		}
	})
}

// growLayout is l with every KV buffer one page longer.
func growLayout(l *kvlayout.BufferLayout) *kvlayout.BufferLayout {
	n := *l
	n.KV = slices.Clone(l.KV)
	for i := range n.KV {
		n.KV[i].Length += n.KV[i].ItemLen
	}
	return &n
}

// TestRegisterLayoutRefusedWhileCopiesInFlight: the old buffers cannot be
// released while copies into them are in flight — the daemon's own batch,
// or the agent's refusal — so the new layout is refused with that reason
// and the old one stays registered.
func TestRegisterLayoutRefusedWhileCopiesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newLayoutRig(t)
		r.ag.SetHold(func(kvcopy.Batch) bool { return true })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { _, err := r.eng.Transfer(ctx, r.chunk(0, r.els)); done <- err }()
		synctest.Wait()
		if _, err := r.eng.RegisterLayout(context.Background(), 0, 0, growLayout(r.els[0])); err == nil || !strings.Contains(err.Error(), "in flight") {
			t.Errorf("RegisterLayout with a batch of the daemon in flight = %v; want refused", err)
		}
		cancel()
		<-done
		r.ag.SetHold(nil)
		busy := fmt.Errorf("deregister %q: %w", r.els[0].KV[0].Name, hostmem.ErrBusy)
		r.ag.set(func(f *faultAgent) { f.deregErr = busy })
		_, err := r.eng.RegisterLayout(context.Background(), 0, 0, growLayout(r.els[0]))
		if err == nil || !strings.Contains(err.Error(), busy.Error()) || errors.Is(err, transfer.ErrEngineUnavailable) {
			t.Errorf("RegisterLayout with the agent refusing the deregistration = %v; want refused with the agent's reason", err)
		}
		if d := r.eng.LayoutDropped(0, 0); d != "" || !r.registered(r.els[0].KV[0].Name) {
			t.Errorf("the old layout: dropped %q, registered %v; want it kept", d, r.registered(r.els[0].KV[0].Name))
		}
		if _, err := r.eng.Transfer(context.Background(), r.chunk(0, r.els)); err != nil {
			t.Errorf("a chunk in the kept layout: %v", err)
		}
	})
}

// TestHealthCheckDuringSlowRegistration: a registration the agent is slow
// to answer does not make the health checks meanwhile mark the agent down.
func TestHealthCheckDuringSlowRegistration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newLayoutRig(t)
		bigger := growLayout(r.els[1])
		hold := make(chan struct{})
		r.ag.set(func(f *faultAgent) { f.hold, f.holdName = hold, bigger.KV[0].Name })
		done := make(chan error, 1)
		go func() { _, err := r.eng.RegisterLayout(context.Background(), 0, 1, bigger); done <- err }()
		time.Sleep(3 * rigInterval) // < the registration's bound (batch_timeout 5s)
		synctest.Wait()
		if up, why := r.eng.Ready(); !up {
			t.Errorf("Ready = false (%s) while a registration waits for the agent", why)
		}
		close(hold)
		if err := <-done; err != nil {
			t.Errorf("RegisterLayout: %v", err)
		}
	})
}

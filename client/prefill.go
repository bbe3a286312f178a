package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Prefill is one prefill scheduler rank's view of a daemon
// (Client.Prefill): its registration (Register), its heartbeat (Heartbeat,
// RunHeartbeat), its DP bindings (BindRoom) and the delivery of each room's
// KV (SendRoom, ReportRoom; or its steps AwaitDestination, Transfer,
// ReportTransfer and AckRoomEnd for a prefill that drives them itself). It
// holds the rank's state (its registration, the daemon incarnation it
// knows) but no connection of its own: the rank's shared PrefillSession
// stream (TransportStreams) belongs to its Client, which opens it while
// the rank uses it and ends it at Close. It is safe for concurrent use:
// one goroutine runs RunHeartbeat while others send rooms.
//
// # Incarnations
//
// The daemon draws a new incarnation at every start. The Prefill records it
// from every registration and heartbeat answer, and every request it sends
// about a destination names the destination's incarnation and attempt.
// When it learns another incarnation than the one it holds (a registration
// or heartbeat answer, a destination, or the daemon's STALE_INCARNATION
// refusal), every destination of the old one is void: each SendRoom and
// ReportRoom holding one stops before its next write (Move, Transfer) or
// report and returns an *IncarnationChangedError
// (errors.Is(err, ErrIncarnationChanged)); the context of a Move or an RPC
// in flight for it is cancelled. Re-registering is automatic: RunHeartbeat
// registers again on its next beat (the daemon that restarted answers the
// heartbeat NOT_FOUND, or the change was learned elsewhere); a caller that
// does not run RunHeartbeat calls Register. The caller then hands the room
// off again (a new claim: the new daemon knows nothing of the old one).
type Prefill struct {
	c     *Client
	reg   *pb.RegisterPrefillRequest
	rank  *pb.PrefillRank
	every time.Duration
	onErr func(error)
	onInc func(old, new uint64)
	// mux is the rank's shared session (prefill_mux.go), under
	// TransportStreams: the Client holds it while the rank uses it.
	mux *prefillMux
	// offers, for a FleetPrefill's member, are the rooms the fleet's
	// daemons offered the rank: its sessions ask for offers
	// (prefill_offers.go). nil otherwise.
	offers *offerTable

	mu       sync.Mutex
	resp     *pb.RegisterPrefillResponse
	interval time.Duration // the daemon's heartbeat interval, 0 until known
	// gen is the daemon incarnation the rank holds destinations of; nil
	// until one is known.
	gen *generation
	// reregister: a new incarnation was learned other than by Register;
	// the next beat registers again.
	reregister bool
	// registered is closed (and replaced) at every successful Register: a
	// hand-off the daemon refused as unregistered waits on it while a
	// RunHeartbeat registers the rank again (prefillMux.getHandOff).
	registered chan struct{}
	// beating counts the RunHeartbeat loops on the shared session.
	beating int

	// closed: Close was called; the rank neither beats nor registers.
	// done is closed then (once), waking a unary RunHeartbeat.
	closed    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
	// regMu orders registrations before the deregistration: Register
	// holds it shared for its RPC, Close takes it once closed is set, so
	// that no registration sent before Close lands after its goodbye.
	regMu sync.RWMutex
}

// errRankClosed is what a closed rank's Register and RunHeartbeat return.
func errRankClosed(op string) *Error {
	return localError(op, codes.Canceled, "the prefill rank was closed (Prefill.Close)")
}

// Close tells the daemon that the rank's prefill instance stops cleanly
// (Bootstrap.DeregisterPrefill): the instance leaves the registry (with a
// fleet registry, on every daemon) and its rooms still handing off fail at
// once with FAILURE_CODE_PREFILL_LOST, instead of when its heartbeats have
// been missing for their liveness bound. It first stops the rank: its
// shared session ends (a RunHeartbeat returns ErrCanceled, hand-offs in
// flight end with ErrCanceled) and Register refuses from then on, so that
// no beat registers the instance again. Call it once the instance stops
// serving, from any one of its ranks (it removes every rank of the
// instance, named by bootstrap_addr and instance_id). Bounded by ctx;
// retried on Unavailable; a second Close, or one for an instance already
// gone, is nil. A closed Prefill stays closed: a new instance (or the same
// one starting again) registers through a new Prefill.
func (p *Prefill) Close(ctx context.Context) error {
	_, err := p.Deregister(ctx, "")
	return err
}

// Deregister is Close with a reason (logged by the daemon and named in
// the rooms' failure; "" is "the prefill instance stopped"), returning the
// daemon's answer: whether the instance was registered and how many of
// that daemon's rooms failed.
func (p *Prefill) Deregister(ctx context.Context, reason string) (*pb.DeregisterPrefillResponse, error) {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		close(p.done)
		p.mux.close()
	})
	p.regMu.Lock()   // a registration in flight lands first
	p.regMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
	req := &pb.DeregisterPrefillRequest{BootstrapAddr: p.reg.GetBootstrapAddr(), InstanceId: p.reg.GetInstanceId(), Reason: reason}
	return invoke(ctx, p.c, pb.Bootstrap_DeregisterPrefill_FullMethodName, req, p.c.boot.DeregisterPrefill)
}

// PrefillOption configures a Prefill.
type PrefillOption func(*Prefill)

// HeartbeatEvery sets how often RunHeartbeat beats, instead of half the
// interval the daemon gives at registration; d <= 0 keeps that default.
func HeartbeatEvery(d time.Duration) PrefillOption {
	return func(p *Prefill) { p.every = d }
}

// OnHeartbeatError is called, from RunHeartbeat's goroutine, with every error
// the loop recovers from: a failed beat it will repeat, or the ErrNotFound
// that made it register again. Use it to log.
func OnHeartbeatError(f func(error)) PrefillOption {
	return func(p *Prefill) { p.onErr = f }
}

// OnIncarnationChange is called when the Prefill learns that the daemon's
// incarnation changed from old to new (the daemon restarted): every
// destination of old is void by then. It is called from the goroutine that
// learned it (RunHeartbeat's, Register's caller's, a hand-off's), not with
// the Prefill's lock held. Use it to log, or to hand the rooms off again.
func OnIncarnationChange(f func(old, new uint64)) PrefillOption {
	return func(p *Prefill) { p.onInc = f }
}

// Prefill returns the prefill side of the rank described by reg (a copy is
// kept; reg may be reused). The rank's identity (Rank) is derived from reg
// the way the daemon keys it.
func (c *Client) Prefill(reg *pb.RegisterPrefillRequest, opts ...PrefillOption) *Prefill {
	reg = proto.CloneOf(reg)
	if reg == nil {
		reg = &pb.RegisterPrefillRequest{}
	}
	par := reg.GetParallel()
	dp := par.GetAttnDpRank()
	if par.GetSystemDpSize() > 1 {
		dp = par.GetSystemDpRank()
	}
	p := &Prefill{c: c, reg: reg, done: make(chan struct{}), rank: &pb.PrefillRank{
		BootstrapAddr: reg.GetBootstrapAddr(),
		DpRank:        dp,
		CpRank:        par.GetAttnCpRank(),
		TpRank:        par.GetAttnTpRank(),
		PpRank:        par.GetPpRank(),
	}}
	p.mux = newPrefillMux(p)
	for _, o := range opts {
		if o != nil {
			o(p)
		}
	}
	return p
}

// Rank returns this rank's identity, as AwaitDestination, Transfer and
// Heartbeat name it: the DP group is attn_dp_rank, or system_dp_rank when
// system_dp_size > 1 (SGLang's bootstrap table).
func (p *Prefill) Rank() *pb.PrefillRank { return proto.CloneOf(p.rank) }

// Register registers the rank (RegisterPrefill, SGLang's PUT /route) and
// keeps the answer (Registration): the decode layout, the rank mapping, the
// heartbeat interval and the daemon's incarnation; an incarnation other
// than the one the Prefill held voids every destination of the old one
// (see Prefill). Errors: ErrInvalidArgument (a field, named),
// ErrFailedPrecondition (page size or KV dtype mismatch, with SGLang's
// message; parallel sizes that contradict the instance's other ranks),
// ErrUnauthenticated. Safe to repeat; retried on Unavailable.
func (p *Prefill) Register(ctx context.Context) (*pb.RegisterPrefillResponse, error) {
	p.regMu.RLock()
	defer p.regMu.RUnlock()
	if p.closed.Load() {
		return nil, errRankClosed(opName(pb.Bootstrap_RegisterPrefill_FullMethodName))
	}
	resp, err := invoke(ctx, p.c, pb.Bootstrap_RegisterPrefill_FullMethodName, p.reg, p.c.boot.RegisterPrefill)
	if err != nil {
		return nil, err
	}
	p.learn(resp.GetIncarnation(), true)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resp = resp
	if p.registered != nil {
		close(p.registered)
		p.registered = nil
	}
	if iv := resp.GetHeartbeatInterval().AsDuration(); iv > 0 {
		p.interval = iv
	}
	return resp, nil
}

// registeredSignal returns a channel closed at the next successful
// Register, and whether a RunHeartbeat on the shared session runs (which
// registers the rank again when the daemon forgot it).
func (p *Prefill) registeredSignal() (<-chan struct{}, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.registered == nil {
		p.registered = make(chan struct{})
	}
	return p.registered, p.beating > 0
}

// Registration returns the last successful registration's answer, or nil.
func (p *Prefill) Registration() *pb.RegisterPrefillResponse {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resp
}

// defaultHeartbeatInterval is SGLang's heartbeat interval, used until the
// daemon has given one.
const defaultHeartbeatInterval = 5 * time.Second

func (p *Prefill) heartbeatInterval() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.interval > 0 {
		return p.interval
	}
	return defaultHeartbeatInterval
}

// cadence is the time between beats: HeartbeatEvery, or half the daemon's
// interval, so that one late beat is not a missed one even when the daemon
// tolerates a single miss (heartbeat_max_failures 1).
func (p *Prefill) cadence() time.Duration {
	if p.every > 0 {
		return p.every
	}
	return p.heartbeatInterval() / 2
}

// RunHeartbeat keeps the rank alive until ctx ends, and returns ctx's error
// then. It registers first if Register has not succeeded yet, then beats
// every half heartbeat interval (see HeartbeatEvery); when the daemon answers
// ErrNotFound (it declared the rank dead, or restarted) it registers again,
// and so it does on the beat after the Prefill learned a new daemon
// incarnation anywhere else (a heartbeat answer, a hand-off).
// Transient failures (ErrUnavailable, a beat that timed out) are retried on
// the next beat and passed to OnHeartbeatError; errors that repeating cannot
// fix (ErrInvalidArgument, ErrFailedPrecondition, ErrUnauthenticated,
// ErrPermissionDenied, ErrUnimplemented) end the loop and are returned.
// A rank whose daemons share their registry (a fleet) runs
// RunHeartbeatFailover instead.
//
// Under TransportStreams (the default) the beats are the rank's shared
// session's (see SendRoom): RunHeartbeat registers first as above, then
// keeps the session open (its pings are the beats; no unary Heartbeat is
// sent), re-opens it when it ends, under the retry policy's backoff, and
// registers again when the daemon ended it NOT_FOUND or refused its
// re-open as of an earlier incarnation (a restart: OnIncarnationChange is
// called, the old destinations are void). While no session can be opened
// (the daemon unreachable, or it does not serve PrefillSession) it beats
// unary every cadence, as under TransportUnary, and tries the session again.
// Its errors go to OnHeartbeatError; after Client.Close it returns
// ErrCanceled. Once it returned, the session closes when no hand-off uses
// it any more: the rank stops beating, as under TransportUnary.
func (p *Prefill) RunHeartbeat(ctx context.Context) error {
	if p.c.transport == TransportStreams {
		return p.runHeartbeatStreams(ctx) // prefill_mux.go
	}
	var first time.Duration
	if p.Registration() != nil {
		first = p.cadence()
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return errRankClosed("Heartbeat")
		case <-t.C:
		}
		if err := p.beat(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if permanent(err) {
				return err
			}
			if p.onErr != nil {
				p.onErr(err)
			}
		}
		t.Reset(p.cadence())
	}
}

// Heartbeat sends one heartbeat of the rank (Heartbeat) and records the
// daemon's incarnation and heartbeat interval from the answer, as
// RunHeartbeat's beats do. ErrNotFound means the rank is not registered
// (or was declared dead): register again. Retried on Unavailable.
func (p *Prefill) Heartbeat(ctx context.Context) (*pb.HeartbeatResponse, error) {
	req := &pb.HeartbeatRequest{Rank: p.rank, InstanceId: p.reg.GetInstanceId()}
	resp, err := invoke(ctx, p.c, pb.Bootstrap_Heartbeat_FullMethodName, req, p.c.boot.Heartbeat)
	if err != nil {
		return nil, err
	}
	p.learn(resp.GetIncarnation(), false)
	if iv := resp.GetInterval().AsDuration(); iv > 0 {
		p.mu.Lock()
		p.interval = iv
		p.mu.Unlock()
	}
	return resp, nil
}

// beat sends one heartbeat (or registration), bounded by the heartbeat
// interval.
func (p *Prefill) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.heartbeatInterval())
	defer cancel()
	if p.Registration() == nil || p.mustReregister() {
		_, err := p.Register(ctx)
		return err
	}
	_, err := p.Heartbeat(ctx)
	if errors.Is(err, ErrNotFound) {
		if p.onErr != nil {
			p.onErr(err)
		}
		_, err = p.Register(ctx)
	}
	return err
}

// markReregister makes the next beat register again.
func (p *Prefill) markReregister() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reregister = true
}

// mustReregister reports that a new incarnation was learned since the last
// registration.
func (p *Prefill) mustReregister() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reregister
}

// permanent reports errors that repeating the same call cannot fix.
func permanent(err error) bool {
	for _, f := range []error{ErrInvalidArgument, ErrFailedPrecondition, ErrUnauthenticated, ErrPermissionDenied, ErrUnimplemented} {
		if errors.Is(err, f) {
			return true
		}
	}
	return false
}

package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// FleetPrefill is one prefill rank of a fleet of decode daemons that share
// their registry (registry.backend etcd): it hands off every room opened
// for the rank on any daemon of the fleet without being told which daemon
// holds it.
//
// It registers the rank through one daemon (the seed, NewFleetPrefill's
// address) and keeps one PrefillSession with offers with every daemon of
// the fleet, which it finds with GetFleet (every FleetRefresh). Each
// daemon claims for the rank every room it holds for the rank's instance
// and DP rank and offers it on its session (prefill_session.proto,
// Session: Offers), as SGLang's decode side pushes its TransferInfo to the
// prefill: the destination arrives on the owner's session at admission,
// with no claim of the rank's, no extra hop, and no etcd write. SendRoom
// and ReportRoom take the room's offer (waiting for it, at most
// FleetOfferWait) and hand the room off on the session it came on: the
// chunks, reports and acknowledgement go to the room's owner. Each session
// is also the rank's heartbeat on its daemon, so that the instance's lease
// lives while any daemon of the fleet does.
//
// The owner's death fails its rooms on this side within a bound: its
// session ends at once when the daemon's process dies (its host resets the
// connection; a host that vanished is detected by the connection's
// keepalive, KeepaliveTime + KeepaliveTimeout), and the hand-offs of its
// rooms, in flight or to come, then fail once the session could not be
// opened again under the Client's RetryPolicy (DefaultRetryPolicy: 4
// attempts, under 2 s) with ErrUnavailable; a daemon that restarted meanwhile is a new
// incarnation, and they fail with an *IncarnationChangedError. A room is
// never waited for on a daemon that is gone: a hand-off waits only for its
// offer, and a room offered before knows its daemon.
//
// Auth and TLS are the Client's: every daemon is dialed with the same
// options (FleetClientOptions: WithToken, WithTLS, ...), and no daemon
// calls another. Each hand-off's ops carry the caller's trace context as
// SendRoom's do.
//
// Run must run for the FleetPrefill to work (it registers, finds the
// daemons and holds their sessions); SendRoom and ReportRoom may be called
// from any goroutine meanwhile. Close ends everything.
type FleetPrefill struct {
	reg    *pb.RegisterPrefillRequest
	o      fleetOptions
	offers *offerTable
	seed   *fleetMember

	mu      sync.Mutex
	members map[string]*fleetMember // by advertised address, the seed's once known
	running bool
	closed  bool
	wg      sync.WaitGroup
}

// fleetMember is one daemon of the fleet: its Client and the rank's
// Prefill on it.
type fleetMember struct {
	addr    string // advertised address ("" for the seed until GetFleet named it)
	c       *Client
	p       *Prefill
	stop    context.CancelFunc // its session loop's
	done    chan struct{}
	missing int // consecutive refreshes that did not list it
}

// FleetOption configures a FleetPrefill.
type FleetOption func(*fleetOptions)

type fleetOptions struct {
	client    []Option
	prefill   []PrefillOption
	refresh   time.Duration
	offerWait time.Duration
	onErr     func(daemon string, err error)
}

// Defaults of a FleetPrefill.
const (
	// DefaultFleetRefresh is how often the fleet's daemons are listed.
	DefaultFleetRefresh = 2 * time.Second
	// DefaultFleetOfferWait bounds a hand-off waiting for its room's offer:
	// SGLang's bootstrap timeout, as a daemon bounds a claim waiting for
	// its room (timeouts.bootstrap).
	DefaultFleetOfferWait = 300 * time.Second
)

// FleetClientOptions are the options of every Client the FleetPrefill
// makes, one per daemon (WithToken, WithTLS, WithRetry, WithDialOptions,
// ...). The transport is always TransportStreams: offers ride the
// sessions.
func FleetClientOptions(opts ...Option) FleetOption {
	return func(o *fleetOptions) { o.client = append(o.client, opts...) }
}

// FleetPrefillOptions are the options of the rank's Prefill on every daemon
// (HeartbeatEvery, OnHeartbeatError, OnIncarnationChange).
func FleetPrefillOptions(opts ...PrefillOption) FleetOption {
	return func(o *fleetOptions) { o.prefill = append(o.prefill, opts...) }
}

// FleetRefresh sets how often Run lists the fleet's daemons (GetFleet);
// d <= 0 keeps DefaultFleetRefresh. A daemon that joins gets the rank's
// session within it; its rooms opened meanwhile are offered when the
// session opens.
func FleetRefresh(d time.Duration) FleetOption {
	return func(o *fleetOptions) { o.refresh = d }
}

// FleetOfferWait bounds how long SendRoom and ReportRoom wait for their
// room's offer (the room is not open yet, or not resolved to this rank's
// DP rank); d <= 0 keeps DefaultFleetOfferWait.
func FleetOfferWait(d time.Duration) FleetOption {
	return func(o *fleetOptions) { o.offerWait = d }
}

// OnFleetError is called, from Run's goroutines, with every error Run
// recovers from, and the daemon it concerns: a session that ended or could
// not be opened, a GetFleet that failed. Use it to log.
func OnFleetError(f func(daemon string, err error)) FleetOption {
	return func(o *fleetOptions) { o.onErr = f }
}

// NewFleetPrefill builds the rank of reg (copied) of a fleet whose daemon
// seed ("10.0.0.5:7600") it registers through. It does not connect: Run
// does. Errors: the options' (as New's).
func NewFleetPrefill(seed string, reg *pb.RegisterPrefillRequest, opts ...FleetOption) (*FleetPrefill, error) {
	o := fleetOptions{refresh: DefaultFleetRefresh, offerWait: DefaultFleetOfferWait}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.refresh <= 0 {
		o.refresh = DefaultFleetRefresh
	}
	if o.offerWait <= 0 {
		o.offerWait = DefaultFleetOfferWait
	}
	f := &FleetPrefill{reg: proto.CloneOf(reg), o: o, offers: newOfferTable(), members: map[string]*fleetMember{}}
	m, err := f.newMember(seed)
	if err != nil {
		return nil, err
	}
	m.addr = ""
	f.seed = m
	return f, nil
}

// newMember dials one daemon and makes the rank's Prefill on it, with
// offers.
func (f *FleetPrefill) newMember(addr string) (*fleetMember, error) {
	c, err := New(addr, append(slices.Clone(f.o.client), WithTransport(TransportStreams))...)
	if err != nil {
		return nil, err
	}
	p := c.Prefill(f.reg, f.o.prefill...)
	p.offers = f.offers
	return &fleetMember{addr: addr, c: c, p: p, done: make(chan struct{})}, nil
}

// Rank returns the rank's identity (as Prefill.Rank).
func (f *FleetPrefill) Rank() *pb.PrefillRank { return f.seed.p.Rank() }

// Seed returns the rank's Prefill on the seed daemon: its registration
// (Registration) and incarnation.
func (f *FleetPrefill) Seed() *Prefill { return f.seed.p }

// Run registers the rank through the seed and keeps it alive and its
// sessions open with every daemon of the fleet until ctx ends, and returns
// ctx's error then. Through the seed it runs RunHeartbeat (registering
// again when the daemon forgot the rank); every other daemon gets a
// session with offers only, opened again after it ended (a daemon that
// does not know the rank yet, because the registration has not reached it
// through etcd, is asked again after a back-off; one that still does not
// know it when the seed's session is down is registered with). A daemon
// that GetFleet no longer lists twice in a row, and whose session is down,
// is dropped. Errors that repeating cannot fix (the registration refused:
// ErrInvalidArgument, ErrFailedPrecondition, ErrUnauthenticated, ...) end
// Run and are returned. Only one Run at a time (ErrFailedPrecondition
// otherwise).
func (f *FleetPrefill) Run(ctx context.Context) error {
	const op = "FleetPrefill.Run"
	f.mu.Lock()
	switch {
	case f.closed:
		f.mu.Unlock()
		return localError(op, codes.Canceled, "the fleet prefill is closed")
	case f.running:
		f.mu.Unlock()
		return localError(op, codes.FailedPrecondition, "Run is running already")
	}
	f.running = true
	f.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		f.stopMembers()
		f.mu.Lock()
		f.running = false
		f.mu.Unlock()
	}()
	beat := make(chan error, 1)
	go func() { beat <- f.seed.p.RunHeartbeat(ctx) }()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case err := <-beat:
			return err
		case <-t.C:
			f.refresh(ctx)
			t.Reset(f.o.refresh)
		}
	}
}

// report passes an error Run recovers from to OnFleetError.
func (f *FleetPrefill) report(daemon string, err error) {
	if f.o.onErr != nil && err != nil {
		f.o.onErr(daemon, err)
	}
}

// seedName is the seed's name in reports: its advertised address once
// known.
func (f *FleetPrefill) seedName() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.seed.addr != "" {
		return f.seed.addr
	}
	return f.seed.c.conn.Target()
}

// refresh lists the fleet's daemons and starts or stops their sessions,
// once the rank registered through the seed (before, the other daemons
// would not know it).
func (f *FleetPrefill) refresh(ctx context.Context) {
	if f.seed.p.Registration() == nil {
		return
	}
	resp, from, err := f.getFleet(ctx)
	if err != nil {
		if ctx.Err() == nil {
			f.report(f.seedName(), err)
		}
		return
	}
	f.mu.Lock()
	if from == f.seed && f.seed.addr == "" {
		for _, d := range resp.GetDaemons() {
			if d.GetSelf() && d.GetAddress() != "" {
				f.seed.addr = d.GetAddress()
				f.members[f.seed.addr] = f.seed
			}
		}
	}
	named := f.seed.addr != ""
	f.mu.Unlock()
	if !named {
		return // an unnamed seed may be any of them: asked again next time
	}
	listed := map[string]bool{}
	for _, d := range resp.GetDaemons() {
		addr := d.GetAddress()
		if addr == "" {
			continue
		}
		listed[addr] = true
		f.mu.Lock()
		_, known := f.members[addr]
		f.mu.Unlock()
		if !known {
			f.start(ctx, addr)
		}
	}
	f.prune(listed)
}

// getFleet asks the seed, then the other daemons, for the fleet.
func (f *FleetPrefill) getFleet(ctx context.Context) (*pb.GetFleetResponse, *fleetMember, error) {
	f.mu.Lock()
	ms := []*fleetMember{f.seed}
	for _, m := range f.members {
		if m != f.seed {
			ms = append(ms, m)
		}
	}
	f.mu.Unlock()
	var first error
	for _, m := range ms {
		rctx, cancel := context.WithTimeout(ctx, f.o.refresh)
		resp, err := m.c.Admin().GetFleet(rctx)
		cancel()
		if err == nil {
			return resp, m, nil
		}
		if first == nil {
			first = err
		}
	}
	return nil, nil, first
}

// start dials a daemon of the fleet and holds the rank's session with it.
func (f *FleetPrefill) start(ctx context.Context, addr string) {
	m, err := f.newMember(addr)
	if err != nil {
		f.report(addr, err)
		return
	}
	mctx, cancel := context.WithCancel(ctx)
	m.stop = cancel
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		cancel()
		m.c.Close()
		return
	}
	f.members[addr] = m
	f.wg.Add(1)
	f.mu.Unlock()
	go func() {
		defer f.wg.Done()
		defer close(m.done)
		f.hold(mctx, m)
	}()
}

// prune drops the daemons GetFleet did not list twice in a row whose
// session is down.
func (f *FleetPrefill) prune(listed map[string]bool) {
	var gone []*fleetMember
	f.mu.Lock()
	for addr, m := range f.members {
		if m == f.seed {
			continue
		}
		if listed[addr] {
			m.missing = 0
			continue
		}
		if m.missing++; m.missing >= 2 && m.p.mux.live() == nil {
			delete(f.members, addr)
			gone = append(gone, m)
		}
	}
	f.mu.Unlock()
	for _, m := range gone {
		m.stop()
		<-m.done
		m.c.Close()
	}
}

// stopMembers ends every member's session loop and closes its Client.
func (f *FleetPrefill) stopMembers() {
	f.mu.Lock()
	var ms []*fleetMember
	for addr, m := range f.members {
		if m == f.seed {
			continue
		}
		ms = append(ms, m)
		delete(f.members, addr)
	}
	f.mu.Unlock()
	for _, m := range ms {
		m.stop()
	}
	f.wg.Wait()
	for _, m := range ms {
		m.c.Close()
	}
}

// hold keeps the rank's session with offers open on a daemon other than
// the seed until ctx ends.
func (f *FleetPrefill) hold(ctx context.Context, m *fleetMember) {
	defer m.p.mux.acquire()()
	fails, notFound := 0, 0
	for ctx.Err() == nil {
		octx, cancel := context.WithTimeout(ctx, m.p.heartbeatInterval())
		s, err := m.p.mux.get(octx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.report(m.addr, err)
			fails++
			notFound = f.unknownRank(ctx, m, err, notFound)
			if errors.Is(err, ErrIncarnationChanged) {
				continue // learned: the next hello names the new incarnation
			}
			sleep(ctx, min(m.p.c.retry.backoff(fails), m.p.cadence()))
			continue
		}
		fails, notFound = 0, 0
		opened := time.Now()
		select {
		case <-ctx.Done():
			return
		case <-s.Done():
		}
		f.report(m.addr, sessionEnded(muxOp, s.Err()))
		if time.Since(opened) < m.p.cadence() { // not in a tight loop
			fails++
			sleep(ctx, min(m.p.c.retry.backoff(fails), m.p.cadence()))
		}
	}
}

// unknownRank counts a daemon's NOT_FOUND refusals of the rank's session
// (the registration through the seed has not reached it, or the instance
// expired); the third in a row while the seed could not be reached for a
// heartbeat interval registers the rank through this daemon. It returns
// the new count.
func (f *FleetPrefill) unknownRank(ctx context.Context, m *fleetMember, err error, n int) int {
	if !errors.Is(err, ErrNotFound) {
		return 0
	}
	if n++; n < 3 || !f.seed.p.mux.down(f.seed.p.heartbeatInterval()) {
		return n
	}
	rctx, cancel := context.WithTimeout(ctx, m.p.heartbeatInterval())
	defer cancel()
	if _, rerr := m.p.Register(rctx); rerr != nil {
		f.report(m.addr, rerr)
		return n
	}
	return 0
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// BindRoom reports that this rank's DP group scheduled room (as
// Prefill.BindRoom, SGLang's /register_dp_rank), for a prefill that does
// not follow follow_bootstrap_room: a daemon offers a room only once its DP
// rank is resolved, so the room's daemon is not known yet, and the binding
// goes to every daemon the rank holds a session with (the seed included),
// at once. It returns whether a daemon replaced an earlier binding, and
// the first daemon's error, if any (ErrFailedPrecondition: the binding
// contradicts follow_bootstrap_room).
func (f *FleetPrefill) BindRoom(ctx context.Context, room uint64) (bool, error) {
	f.mu.Lock()
	ps := []*Prefill{f.seed.p}
	for _, m := range f.members {
		if m != f.seed {
			ps = append(ps, m.p)
		}
	}
	f.mu.Unlock()
	type answer struct {
		replaced bool
		err      error
	}
	out := make(chan answer, len(ps))
	for _, p := range ps {
		go func() {
			r, err := p.BindRoom(ctx, room)
			out <- answer{r, err}
		}()
	}
	var replaced bool
	var first error
	for range ps {
		a := <-out
		replaced = replaced || a.replaced
		if first == nil {
			first = a.err
		}
	}
	return replaced, first
}

// SendRoom delivers a room's KV through the daemon that holds it, as
// Prefill.SendRoom does (same options, results and errors), without the
// caller naming the daemon: it waits for the room's offer (at most
// FleetOfferWait, bounded by ctx; ErrNotFound past it) and hands the room
// off on the session it came on. A room offered before (a repeated
// hand-off, or one whose session ended) is claimed again on its daemon: a
// daemon that cannot be reached fails it with ErrUnavailable, one that
// restarted with an *IncarnationChangedError.
func (f *FleetPrefill) SendRoom(ctx context.Context, room uint64, o SendOptions) (*pb.Destination, error) {
	return f.handOff(ctx, "SendRoom", room, o, false)
}

// ReportRoom is SendRoom for a prefill that moves the bytes itself, as
// Prefill.ReportRoom.
func (f *FleetPrefill) ReportRoom(ctx context.Context, room uint64, o SendOptions) (*pb.Destination, error) {
	return f.handOff(ctx, "ReportRoom", room, o, true)
}

func (f *FleetPrefill) handOff(ctx context.Context, op string, room uint64, o SendOptions, report bool) (*pb.Destination, error) {
	if o.ChunkPages < 0 {
		return nil, localError(op, codes.InvalidArgument, "SendOptions.ChunkPages: %d must be >= 0 (0 sends every page in one chunk)", o.ChunkPages)
	}
	tk, err := f.offers.take(ctx, op, room, f.o.offerWait)
	if err != nil {
		return nil, err
	}
	p := tk.r.p
	if tk.e != nil {
		p = tk.e.p
	}
	if err := p.c.errIfClosed(op); err != nil {
		if tk.e != nil {
			tk.e.c.Close()
		}
		return nil, localError(op, codes.Unavailable, "room %d's daemon left the fleet", room)
	}
	if tk.e == nil {
		if inc := p.Incarnation(); tk.r.inc != 0 && inc != 0 && inc != tk.r.inc {
			return nil, &IncarnationChangedError{Room: room, Old: tk.r.inc, New: inc}
		}
	}
	return p.handOffTaken(ctx, op, room, o, tk, report)
}

// handOffTaken is a FleetPrefill's hand-off on this member (the room's
// daemon): its claim is the room's offer when it has one (tk.e), else a
// claim on the member's shared session.
func (p *Prefill) handOffTaken(ctx context.Context, op string, room uint64, o SendOptions, tk taken, report bool) (*pb.Destination, error) {
	defer p.mux.acquire()()
	var first *sessionClaim
	var s *prefillSession
	if tk.e != nil {
		first, s = tk.e.c, tk.e.s
	}
	tr, used := p.mux.transportOffered(first, s)
	move := p.transferMove(room, o, p.mux.chunk)
	if report {
		move = p.reportMove(room, o, p.mux.report)
	}
	dest, err := p.handOffOver(ctx, op, room, o, tr, move)
	if first != nil && !used() {
		first.Close()
	}
	return dest, err
}

// Owner returns the advertised address of the daemon that offered room
// (false when no daemon offered it yet, or it was forgotten).
func (f *FleetPrefill) Owner(room uint64) (string, bool) {
	p, ok := f.offers.owner(room)
	if !ok {
		return "", false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for addr, m := range f.members {
		if m.p == p {
			return addr, true
		}
	}
	if p == f.seed.p {
		return f.seed.c.conn.Target(), true
	}
	return "", false
}

// FleetDaemonState is one daemon of a FleetPrefill's fleet, as the rank
// sees it.
type FleetDaemonState struct {
	// Address is the daemon's advertised address (the seed's target until
	// GetFleet named it).
	Address string
	// Seed marks the daemon the rank registers through.
	Seed bool
	// Incarnation is the daemon's, as the rank last learned it (0: none
	// yet).
	Incarnation uint64
	// Session reports whether the rank's session with it is open.
	Session bool
}

// Daemons lists the daemons the rank keeps a session with, sorted by
// address.
func (f *FleetPrefill) Daemons() []FleetDaemonState {
	f.mu.Lock()
	ms := map[string]*fleetMember{}
	for addr, m := range f.members {
		ms[addr] = m
	}
	if f.seed.addr == "" {
		ms[f.seed.c.conn.Target()] = f.seed
	}
	f.mu.Unlock()
	out := make([]FleetDaemonState, 0, len(ms))
	for addr, m := range ms {
		out = append(out, FleetDaemonState{Address: addr, Seed: m == f.seed, Incarnation: m.p.Incarnation(), Session: m.p.mux.live() != nil})
	}
	slices.SortFunc(out, func(a, b FleetDaemonState) int {
		switch {
		case a.Address < b.Address:
			return -1
		case a.Address > b.Address:
			return 1
		}
		return 0
	})
	return out
}

// Close ends the FleetPrefill: Run returns, the hand-offs waiting for an
// offer fail with ErrCanceled, and every Client it made is closed (the
// hand-offs in flight end with ErrCanceled). Idempotent.
func (f *FleetPrefill) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	f.mu.Unlock()
	f.offers.close()
	f.stopMembers()
	return f.seed.c.Close()
}

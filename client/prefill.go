package client

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Prefill is one prefill scheduler rank's side of the hand-off: its
// registration, its heartbeat loop and the delivery of each room's KV. Build
// it with Client.Prefill. It is safe for concurrent use: one goroutine runs
// RunHeartbeat while others send rooms.
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
	// TransportStreams.
	mux *prefillMux

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
}

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
	p := &Prefill{c: c, reg: reg, rank: &pb.PrefillRank{
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

// Register registers the rank (RegisterPrefill) and keeps the answer
// (Registration), its heartbeat interval and the daemon's incarnation: an
// incarnation other than the one the Prefill held voids every destination
// of the old one (see Prefill). Safe to repeat.
func (p *Prefill) Register(ctx context.Context) (*pb.RegisterPrefillResponse, error) {
	resp, err := p.c.RegisterPrefill(ctx, p.reg)
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
// Its errors go to OnHeartbeatError; after Prefill.Close it returns
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

// beat sends one heartbeat (or registration), bounded by the heartbeat
// interval.
func (p *Prefill) beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.heartbeatInterval())
	defer cancel()
	if p.Registration() == nil || p.mustReregister() {
		_, err := p.Register(ctx)
		return err
	}
	resp, err := p.c.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: p.rank, InstanceId: p.reg.GetInstanceId()})
	if errors.Is(err, ErrNotFound) {
		if p.onErr != nil {
			p.onErr(err)
		}
		_, err = p.Register(ctx)
		return err
	}
	if err != nil {
		return err
	}
	p.learn(resp.GetIncarnation(), false)
	if iv := resp.GetInterval().AsDuration(); iv > 0 {
		p.mu.Lock()
		p.interval = iv
		p.mu.Unlock()
	}
	return nil
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

// BindRoom reports that this rank's DP group scheduled room (SGLang's
// POST /register_dp_rank), for prefills that do not follow
// follow_bootstrap_room. It returns whether an earlier binding was replaced.
func (p *Prefill) BindRoom(ctx context.Context, room uint64) (bool, error) {
	resp, err := p.c.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: p.rank.GetBootstrapAddr(), Room: room, DpRank: p.rank.GetDpRank()})
	if err != nil {
		return false, err
	}
	return resp.GetReplaced(), nil
}

// Chunk is one chunk of a room's KV from this rank: a range of the
// destination's pages.
type Chunk struct {
	// Destination is the room's destination for this rank.
	Destination *pb.Destination
	// Index is the chunk_index (0, 1, ...).
	Index int
	// PageOffset and NumPages select Destination.PageIndices[PageOffset :
	// PageOffset+NumPages].
	PageOffset int
	NumPages   int
	// Last marks the rank's final chunk, which carries the room marker.
	Last bool
}

// Pages returns the decode page indices the chunk writes.
func (c Chunk) Pages() []int32 {
	return c.Destination.GetPageIndices()[c.PageOffset : c.PageOffset+c.NumPages]
}

// Bytes is what the chunk weighs by the decode layout, for this rank:
// tokens x Destination.token_bytes, plus state_bytes on the last chunk. The
// daemon refuses a ReportTransfer whose bytes differ from it.
func (c Chunk) Bytes() uint64 {
	d := c.Destination
	ps := int64(d.GetPageSize())
	tokens := min(int64(c.PageOffset+c.NumPages)*ps, int64(d.GetFillLen())) - int64(c.PageOffset)*ps
	n := uint64(max(tokens, 0)) * d.GetTokenBytes()
	if c.Last {
		n += d.GetStateBytes()
	}
	return n
}

// SendOptions shape SendRoom and ReportRoom.
type SendOptions struct {
	// ChunkPages is the number of destination pages per chunk; 0 sends all
	// of them in one chunk.
	ChunkPages int
	// Source, for SendRoom on the delegated transfer path, locates each
	// chunk's bytes on the prefill side (buffer name and prefill pages).
	// nil sends no source (the simulated path ignores it).
	Source func(Chunk) *pb.TransferSource
	// Move, for ReportRoom, moves one chunk's bytes (the prefill's own
	// transfer engine) and returns how many it moved, which must be
	// Chunk.Bytes (the daemon checks it). An error is reported as the
	// chunk's failure, which fails the room. nil reports every chunk moved
	// with Chunk.Bytes.
	Move func(context.Context, Chunk) (uint64, error)
	// OutputIDs go into the metadata slot with the last chunk (aux.output_ids:
	// the first output token).
	OutputIDs []int32
}

// SendRoom delivers a room's KV through the daemon's transfer engine: it
// claims the room (AwaitDestination), waits for the destination, sends its
// pages with Transfer in chunks of o.ChunkPages (the last with
// aux.room_marker = room, SGLang's metadata gate), then waits for the room's
// end on the same stream. A dummy destination (MLA's extra prefill ranks)
// sends nothing and only waits.
//
// It returns the destination and nil once the room succeeded, or nil, nil
// when the room had already succeeded before the call (a repeated hand-off).
// A room that fails is a *RoomFailedError (errors.Is(err, ErrRoomFailed));
// when a chunk's failure revealed it, the error also matches ErrAborted.
// Bound the whole hand-off with ctx.
//
// A daemon restart (a new incarnation, see Prefill) stops the hand-off
// before its next Transfer with an *IncarnationChangedError.
//
// Under TransportStreams (the Client's default) the claim, the chunks and
// the acknowledgement go on the rank's one shared PrefillSession stream
// (shared by every concurrent SendRoom and ReportRoom of the Prefill and
// its RunHeartbeat, open while one of them uses it, re-opened after it
// ended; Prefill.Close ends it), with the same results and errors. A session that ends under the
// hand-off is replaced and the hand-off goes on: it claims again on the
// new session and sends again the chunk whose answer was lost (the daemon
// counts a chunk once: (room, rank, chunk_index) is its key); after
// MaxAttempts sessions in a row ended under it, it fails with the
// session's end (ErrUnavailable for a cut stream). A daemon without
// PrefillSession (ErrUnimplemented) is handed off to unary. One difference:
// the session needs the rank registered (its hello is a beat), so a rank
// the daemon does not know fails with ErrNotFound — at once, unless a
// RunHeartbeat of this Prefill runs: it registers the rank again (after a
// daemon restart, or once the daemon declared the rank dead), and the
// hand-off waits for that registration (at most two heartbeat intervals,
// bounded by ctx) and goes on. The unary claim of a rank whose instance
// the daemon does not know waits for the registration (bounded by ctx and
// the daemon's timeouts.bootstrap).
// WithTransport(TransportUnary) keeps the unary calls: AwaitDestination,
// Transfer per chunk, AckRoomEnd.
func (p *Prefill) SendRoom(ctx context.Context, room uint64, o SendOptions) (*pb.Destination, error) {
	if ok, release, err := p.streams(ctx); ok {
		defer release()
		if err != nil {
			return p.handOffFailed("SendRoom", room, o, err)
		}
		return p.handOffOver(ctx, "SendRoom", room, o, p.mux.transport(), p.transferMove(room, o, p.mux.chunk))
	}
	return p.handOff(ctx, "SendRoom", room, o, p.transferMove(room, o, p.c.Transfer))
}

// transferMove is SendRoom's move: each chunk asked of the daemon's
// transfer engine with transfer (the unary Transfer or a session's Chunk).
func (p *Prefill) transferMove(room uint64, o SendOptions, transfer func(context.Context, *pb.TransferRequest) (*pb.TransferResponse, error)) func(ctx, writeCtx context.Context, ch Chunk, check func() error) error {
	return func(ctx, _ context.Context, ch Chunk, check func() error) error {
		req := &pb.TransferRequest{
			Room: room, Rank: p.rank, ChunkIndex: uint32(ch.Index),
			PageOffset: uint32(ch.PageOffset), NumPages: uint32(ch.NumPages), Last: ch.Last,
			Attempt: ch.Destination.GetAttempt(), Incarnation: ch.Destination.GetIncarnation(),
		}
		if o.Source != nil {
			req.Source = o.Source(ch)
		}
		if ch.Last {
			req.Aux = &pb.Aux{RoomMarker: room, OutputIds: o.OutputIDs}
		}
		if err := check(); err != nil {
			return err
		}
		_, err := transfer(ctx, req)
		return err
	}
}

// ReportRoom is SendRoom for a prefill that moves the bytes itself (as
// Mooncake prefills do): each chunk is moved by o.Move, then reported with
// ReportTransfer (the last with metadata_room_marker = room). A Move error is
// reported as the chunk's failure, and ReportRoom returns a
// *RoomFailedError whose Err is the Move error.
//
// A daemon restart (a new incarnation, see Prefill) stops the hand-off
// before its next Move and before its next report with an
// *IncarnationChangedError; a Move in flight then sees its context
// cancelled, and what it moved is not reported.
//
// The transport is SendRoom's: under TransportStreams (the default) the
// claim, the reports and the acknowledgement go on the rank's shared
// session; a report whose answer a session's end lost is sent again on the
// next session (the daemon counts it once), and Move is not run again.
func (p *Prefill) ReportRoom(ctx context.Context, room uint64, o SendOptions) (*pb.Destination, error) {
	if ok, release, err := p.streams(ctx); ok {
		defer release()
		if err != nil {
			return p.handOffFailed("ReportRoom", room, o, err)
		}
		return p.handOffOver(ctx, "ReportRoom", room, o, p.mux.transport(), p.reportMove(room, o, p.mux.report))
	}
	return p.handOff(ctx, "ReportRoom", room, o, p.reportMove(room, o, p.c.ReportTransfer))
}

// reportMove is ReportRoom's move: o.Move, then the chunk reported with
// report (the unary ReportTransfer or a session's Report).
func (p *Prefill) reportMove(room uint64, o SendOptions, report func(context.Context, *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error)) func(ctx, writeCtx context.Context, ch Chunk, check func() error) error {
	return func(ctx, writeCtx context.Context, ch Chunk, check func() error) error {
		n := ch.Bytes()
		var moveErr error
		if o.Move != nil {
			n, moveErr = o.Move(writeCtx, ch) // ends when the room ends (drain.go)
		}
		if err := check(); err != nil {
			return err
		}
		req := &pb.ReportTransferRequest{
			Room: room, Rank: p.rank, ChunkIndex: uint32(ch.Index),
			PageOffset: uint32(ch.PageOffset), NumPages: uint32(ch.NumPages), Last: ch.Last,
			Success: moveErr == nil, Bytes: n, Attempt: ch.Destination.GetAttempt(),
			Incarnation: ch.Destination.GetIncarnation(),
		}
		switch {
		case moveErr != nil:
			req.FailureReason = moveErr.Error()
		case ch.Last:
			req.MetadataRoomMarker = room
		}
		if _, err := report(ctx, req); err != nil {
			return err
		}
		if moveErr != nil {
			return &moveFailure{moveErr}
		}
		return nil
	}
}

// moveFailure is a Move error ReportRoom reported as the chunk's failure.
type moveFailure struct{ err error }

// Error returns the Move error's text.
func (m *moveFailure) Error() string { return m.err.Error() }

// Unwrap returns the Move error.
func (m *moveFailure) Unwrap() error { return m.err }

// handOff is SendRoom and ReportRoom: claim, move every chunk with move,
// wait for the end. The hand-off is bound to the daemon incarnation the
// Prefill holds when it starts (or, when none is known yet, to the
// destination's): move calls check right before each write or report, and
// its context ends once that incarnation is void.
func (p *Prefill) handOff(ctx context.Context, op string, room uint64, o SendOptions, move func(ctx, writeCtx context.Context, ch Chunk, check func() error) error) (*pb.Destination, error) {
	return p.handOffOver(ctx, op, room, o, unaryTransport(p), move)
}

// claimStream is a claim's events: a DestinationStream (unary API) or a
// SessionClaim (prefill session).
type claimStream interface {
	Next() (*Event, error)
	Close()
}

// handTransport is how a hand-off claims and acknowledges: the unary API
// or a prefill session. The state machine (handOffOver, moveAndWait) is
// the same over both.
type handTransport struct {
	claim func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error)
	ack   func(ctx context.Context, room uint64, dest *pb.Destination) error
}

func unaryTransport(p *Prefill) handTransport {
	return handTransport{
		claim: func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error) {
			s, err := p.c.AwaitDestination(ctx, req)
			if err != nil {
				return nil, err
			}
			return s, nil
		},
		ack: func(ctx context.Context, room uint64, dest *pb.Destination) error {
			_, err := p.AckRoomEnd(ctx, room, dest)
			return err
		},
	}
}

// handOffOver is handOff over tr.
func (p *Prefill) handOffOver(ctx context.Context, op string, room uint64, o SendOptions, tr handTransport, move func(ctx, writeCtx context.Context, ch Chunk, check func() error) error) (*pb.Destination, error) {
	if o.ChunkPages < 0 {
		return nil, localError(op, codes.InvalidArgument, "SendOptions.ChunkPages: %d must be >= 0 (0 sends every page in one chunk)", o.ChunkPages)
	}
	g := p.generation()
	if err := p.check(g, room); err != nil {
		return nil, err
	}
	hctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(g.ctx, cancel)()
	s, err := tr.claim(hctx, &pb.AwaitDestinationRequest{Room: room, Rank: p.rank, Incarnation: p.incOf(g)})
	if err != nil {
		return nil, p.voided(g, room, err)
	}
	defer s.Close()
	var dest *pb.Destination
	for dest == nil {
		ev, err := s.Next()
		if err != nil {
			return nil, p.voided(g, room, err)
		}
		if ev.Done != nil {
			return nil, nil
		}
		dest = ev.Destination
	}
	if err := p.bind(g, room, dest); err != nil {
		return nil, err
	}
	return p.moveAndWait(ctx, hctx, g, room, s, dest, o, tr, move) // drain.go
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

// explain turns a chunk's error into the room's failure when the room failed
// (a chunk answered Aborted or FailedPrecondition, or a Move failed).
func (p *Prefill) explain(ctx context.Context, room uint64, err error) error {
	if mf, ok := err.(*moveFailure); ok {
		err = mf.err
	} else if e, ok := err.(*Error); !ok || (e.family != ErrAborted && e.family != ErrFailedPrecondition) {
		return err
	}
	r, gerr := p.c.GetRoom(ctx, &pb.GetRoomRequest{Room: room})
	if gerr != nil || r.GetPhase() != pb.RoomPhase_ROOM_PHASE_FAILED {
		return err
	}
	rf := roomFailed(room, r.GetFailure())
	rf.Err = err
	return rf
}

// chunks splits a destination's pages into chunks of n pages (0: one chunk).
func chunks(d *pb.Destination, n int) []Chunk {
	total := len(d.GetPageIndices())
	if n <= 0 || n > total {
		n = total
	}
	if total == 0 {
		return []Chunk{{Destination: d, Last: true}}
	}
	out := make([]Chunk, 0, (total+n-1)/n)
	for off := 0; off < total; off += n {
		num := min(n, total-off)
		out = append(out, Chunk{Destination: d, Index: len(out), PageOffset: off, NumPages: num, Last: off+num == total})
	}
	return out
}

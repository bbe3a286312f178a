package client

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

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
// tokens x Destination.token_bytes, plus state_bytes on the last chunk; when
// the decode engine registered its buffer layout (Destination.page_bytes
// set), its pages x page_bytes, plus aux_bytes and state_bytes on the last
// chunk. The daemon refuses a ReportTransfer whose bytes differ from it.
func (c Chunk) Bytes() uint64 {
	d := c.Destination
	if pb := d.GetPageBytes(); pb > 0 {
		n := uint64(max(c.NumPages, 0)) * pb
		if c.Last {
			n += d.GetAuxBytes() + d.GetStateBytes()
		}
		return n
	}
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
// ended; Client.Close ends it), with the same results and errors. A session that ends under the
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
	return p.handOff(ctx, "SendRoom", room, o, p.transferMove(room, o, p.Transfer))
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
	return p.handOff(ctx, "ReportRoom", room, o, p.reportMove(room, o, p.ReportTransfer))
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
// sessionClaim (prefill session).
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
			s, err := p.AwaitDestination(ctx, req)
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

// streams reports whether the hand-offs go on the shared session: the
// Client's transport is TransportStreams and the daemon serves
// PrefillSession (an older daemon's ErrUnimplemented falls back to the
// unary API, for this call).
// The session's open error, if any, is the hand-off's (handOffFailed):
// the claim would only open it again.
func (p *Prefill) streams(ctx context.Context) (bool, func(), error) {
	if p.c.transport != TransportStreams {
		return false, func() {}, nil
	}
	release := p.mux.acquire()
	_, err := p.mux.getHandOff(ctx)
	if errors.Is(err, ErrUnimplemented) {
		release()
		return false, func() {}, nil
	}
	return true, release, err
}

// handOffFailed is a hand-off whose session could not be opened: the
// errors handOffOver would return first, else err (an incarnation change
// learned from the refused open, for room).
func (p *Prefill) handOffFailed(op string, room uint64, o SendOptions, err error) (*pb.Destination, error) {
	if o.ChunkPages < 0 {
		return nil, localError(op, codes.InvalidArgument, "SendOptions.ChunkPages: %d must be >= 0 (0 sends every page in one chunk)", o.ChunkPages)
	}
	g := p.generation()
	if cerr := p.check(g, room); cerr != nil {
		return nil, cerr
	}
	return nil, p.voided(g, room, err)
}

// explain turns a chunk's error into the room's failure when the room failed
// (a chunk answered Aborted or FailedPrecondition, or a Move failed).
func (p *Prefill) explain(ctx context.Context, room uint64, err error) error {
	if mf, ok := err.(*moveFailure); ok {
		err = mf.err
	} else if e, ok := err.(*Error); !ok || (e.family != ErrAborted && e.family != ErrFailedPrecondition) {
		return err
	}
	r, gerr := p.c.getRoom(ctx, &pb.GetRoomRequest{Room: room})
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

package client

import (
	"context"
	"errors"
	"io"
	"slices"
	"sync"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// engineSession is the decode engine's multiplexed stream
// (EngineSession.Session, engine_session.proto): batches of opens,
// releases, aborts and resumes on one stream, and the events of every room
// it subscribed. It is the Client's: OpenAndWait's shared session
// (TransportStreams, engine_mux.go) is one, and ReleaseRoom and AbortRoom
// ride it while it is up (engine_ops.go).
//
// Open, Release, Abort and Resume may be called from any goroutine; Next
// from one. The stream's events must be read (Next) for replies to come:
// the session reads the wire in order, and a reader that leaves events
// unread holds its replies back and is, past the daemon's queue bound
// (4,096), cut with ErrResourceExhausted ("slow consumer"). Its rooms go on;
// a new session's Resume(Cursors()) gets what was missed (the mux does so).
// The session is not re-opened by itself.
//
// A request handed to an op must not be modified until the op returns,
// nor after a return on ctx's end (the op may still be in the session's
// queue): pass a copy if it is reused.
//
// Ops sent while another is being written go out together in its next
// message (EngineRequest.more) once the daemon said it reads them (its
// header, pb.PackKey), and the daemon packs its queued events the same way
// (the session asks it to); sessionEvents(pb.EngineEvents_ENGINE_EVENTS_OUTCOME)
// asks for one event per room (its outcome) instead of one per transition.
type engineSession struct {
	stream pb.EngineSession_SessionClient
	cancel context.CancelFunc
	events pb.EngineEvents // what Open and Resume subscribe (sessionEvents)

	// out writes the ops, packing those queued meanwhile (EngineRequest.more).
	out *sendQueue[*pb.EngineRequest]
	seq uint64 // under out's lock

	mu      sync.Mutex
	pending map[uint64]chan *pb.EngineReply
	// cursors: for each room not yet ended, the last seq Next returned.
	cursors map[uint64]uint32
	err     error         // why the stream ended (io.EOF: OK)
	done    chan struct{} // closed when the stream ended

	roomEvents chan *pb.EngineRoomEvent
	// negotiated is closed once the daemon's header was read (and with
	// it whether out packs).
	negotiated chan struct{}
}

// engineSessionOption configures an engineSession.
type engineSessionOption func(*engineSession)

// sessionEvents chooses which events of its rooms the session's Open and
// Resume subscribe (EngineEvents in engine_session.proto):
// pb.EngineEvents_ENGINE_EVENTS_ALL (the default) every event;
// pb.EngineEvents_ENGINE_EVENTS_OUTCOME only each room's outcome (its
// SUCCEEDED event, or its terminal event if it fails first), after which
// the room leaves the session.
func sessionEvents(e pb.EngineEvents) engineSessionOption {
	return func(s *engineSession) { s.events = e }
}

// sessionResult is one room's answer to an op of an engineSession: what
// its unary RPC would have answered (Open, Release or Abort, by the op), or
// Err, an *Error with the unary RPC's code and message (RetryAfter works on
// it).
type sessionResult struct {
	Room    uint64
	Open    *pb.OpenRoomResponse
	Release *pb.ReleaseRoomResponse
	Abort   *pb.AbortRoomResponse
	Declare *pb.DeclareDestinationResponse
	Err     error
	// Incarnation is the daemon's incarnation as the op's reply gave it.
	Incarnation uint64
}

// sessionEventBuffer is how many room events the session holds that Next
// has not returned yet; beyond, it stops reading the stream (the daemon's
// queue then fills).
const sessionEventBuffer = 256

// openEngineSession opens the decode engine's stream. ctx bounds the whole
// stream; Close ends it. Needs the token when the daemon has one.
func (c *Client) openEngineSession(ctx context.Context, opts ...engineSessionOption) (*engineSession, error) {
	const op = "EngineSession"
	if err := c.errIfClosed(op); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := pb.NewEngineSessionClient(c.conn).Session(withPack(sctx), c.callOpts...)
	if err != nil {
		cancel()
		return nil, toError(op, err)
	}
	s := &engineSession{
		stream: stream, cancel: cancel,
		pending: map[uint64]chan *pb.EngineReply{}, cursors: map[uint64]uint32{},
		done: make(chan struct{}), roomEvents: make(chan *pb.EngineRoomEvent, sessionEventBuffer),
		negotiated: make(chan struct{}),
	}
	for _, o := range opts {
		if o != nil {
			o(s)
		}
	}
	// One request per message until the daemon's header says it reads
	// packed ones (receive).
	s.out = newSendQueue(1, pb.MaxSessionMessageBytes, engineRequestSize, func(first *pb.EngineRequest, more []*pb.EngineRequest) {
		first.More = more
		_ = stream.Send(first) // a failed send: receive gets the stream's status
	})
	go s.receive()
	return s, nil
}

// receive reads the stream: replies go to their op, room events to Next.
func (s *engineSession) receive() {
	defer close(s.roomEvents)
	// The header comes first (the daemon sends it when the stream starts;
	// one without packing, with its first message or its end).
	if md, err := s.stream.Header(); err == nil && packs(md) {
		s.out.setMax(1 + pb.MaxEngineRequestsPerMessage)
	}
	close(s.negotiated)
	for {
		ev, err := s.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				err = toError("EngineSession", err)
			}
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			close(s.done)
			return
		}
		s.dispatch(ev)
		for _, m := range ev.GetMore() {
			s.dispatch(m)
		}
	}
}

// dispatch hands one event to its op (a reply) or to Next (a room event).
func (s *engineSession) dispatch(ev *pb.EngineEvent) {
	switch e := ev.GetEvent().(type) {
	case *pb.EngineEvent_Reply:
		s.mu.Lock()
		ch := s.pending[e.Reply.GetSeq()]
		delete(s.pending, e.Reply.GetSeq())
		// A room an Open subscribed has a cursor from now on (0: no event
		// seen), so that Resume(Cursors()) on another session watches it
		// even before (or, with ENGINE_EVENTS_OUTCOME, without) an event:
		// set here, before the room's events are dispatched.
		for _, r := range e.Reply.GetResults() {
			if r.GetOpen() != nil && r.GetCode() == 0 {
				if _, ok := s.cursors[r.GetRoom()]; !ok {
					s.cursors[r.GetRoom()] = 0
				}
			}
		}
		s.mu.Unlock()
		if ch != nil {
			ch <- e.Reply
		}
	case *pb.EngineEvent_Room:
		s.roomEvents <- e.Room
	}
}

// engineRequestSize is a request's size for the packing budget: an Open's
// or a Watch's (which grow with their rooms) measured, a release's or an
// abort's bounded from above.
func engineRequestSize(r *pb.EngineRequest) int {
	if r.GetOpen() != nil || r.GetWatch() != nil {
		return proto.Size(r)
	}
	return 4 << 10 // a ReleaseRoomRequest or AbortRoomRequest (its reason is at most 1 KiB)
}

// Next returns the next event of a subscribed room, in order per room.
// After the stream ended it returns the events still held, then io.EOF
// (the stream ended OK: half-closed with every room ended, or the daemon
// stopped) or the stream's *Error.
func (s *engineSession) Next() (*pb.EngineRoomEvent, error) {
	ev, ok := <-s.roomEvents
	if !ok {
		<-s.done
		s.mu.Lock()
		defer s.mu.Unlock()
		return nil, s.err
	}
	s.mu.Lock()
	// A room's last event: the one saying its pages are reusable, or a
	// succeeded room's outcome.
	if ev.GetEvent().GetPagesReusable() || (s.events == pb.EngineEvents_ENGINE_EVENTS_OUTCOME && ev.GetEvent().GetTransition().GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED) {
		delete(s.cursors, ev.GetRoom())
	} else {
		s.cursors[ev.GetRoom()] = ev.GetSeq()
	}
	s.mu.Unlock()
	return ev, nil
}

// Cursors returns, for every room whose events Next returned and that has
// not ended, the last seq returned: what Resume on a new session needs to
// send only what was missed.
func (s *engineSession) Cursors() map[uint64]uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint64]uint32, len(s.cursors))
	for r, q := range s.cursors {
		out[r] = q
	}
	return out
}

// Open opens a batch of rooms (1..256), each as OpenRoom, and subscribes
// them: their events come from Next until each one's terminal event. The
// rooms' spans join ctx's trace (its W3C traceparent travels with the op).
// One sessionResult per request, in order; the error is the op's (a batch
// refused as a whole, ErrInvalidArgument) or the stream's.
func (s *engineSession) Open(ctx context.Context, reqs ...*pb.OpenRoomRequest) ([]sessionResult, error) {
	return s.do(ctx, "EngineSession.Open", &pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: &pb.EngineOpen{Rooms: reqs, Events: s.events}}})
}

// OpenEach is Open with a context per room (ctxs[i] for reqs[i], or none):
// each room's span joins its own context's trace (EngineOpen.traceparents),
// so that a batch of several callers' rooms keeps one trace per request.
func (s *engineSession) OpenEach(ctx context.Context, reqs []*pb.OpenRoomRequest, ctxs []context.Context) ([]sessionResult, error) {
	o := &pb.EngineOpen{Rooms: reqs, Events: s.events}
	for i, rc := range ctxs {
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(rc, carrier)
		if tp := carrier.Get("traceparent"); tp != "" && len(ctxs) == len(reqs) {
			if o.Traceparents == nil {
				o.Traceparents = make([]string, len(reqs))
			}
			o.Traceparents[i] = tp
		}
	}
	return s.do(ctx, "EngineSession.Open", &pb.EngineRequest{Op: &pb.EngineRequest_Open{Open: o}})
}

// Release is ReleaseRoom on the session.
func (s *engineSession) Release(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	res, err := s.one(ctx, "EngineSession.Release", &pb.EngineRequest{Op: &pb.EngineRequest_Release{Release: req}})
	if err != nil {
		return nil, err
	}
	return res.Release, nil
}

// Abort is AbortRoom on the session.
func (s *engineSession) Abort(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	res, err := s.one(ctx, "EngineSession.Abort", &pb.EngineRequest{Op: &pb.EngineRequest_Abort{Abort: req}})
	if err != nil {
		return nil, err
	}
	return res.Abort, nil
}

// Resume subscribes rooms on this session from the event after the given
// seq (another session's Cursors, or 0 for a room's whole timeline): each
// room's missed events, then its live ones, none twice. Rooms are sent in
// order of their ids, at most 4,096 per op. One sessionResult per room
// (ErrNotFound: the room is gone, e.g. the daemon restarted).
func (s *engineSession) Resume(ctx context.Context, cursors map[uint64]uint32) ([]sessionResult, error) {
	rooms := make([]uint64, 0, len(cursors))
	for r := range cursors {
		rooms = append(rooms, r)
	}
	slices.Sort(rooms)
	var out []sessionResult
	for chunk := range slices.Chunk(rooms, pb.MaxEngineWatchRooms) {
		w := &pb.EngineWatch{Events: s.events}
		for _, r := range chunk {
			w.Rooms = append(w.Rooms, &pb.EngineWatchRoom{Room: r, After: cursors[r]})
		}
		res, err := s.do(ctx, "EngineSession.Resume", &pb.EngineRequest{Op: &pb.EngineRequest_Watch{Watch: w}})
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// CloseSend says no more ops come: the daemon ends the stream OK once every
// subscribed room ended (Next then returns io.EOF).
func (s *engineSession) CloseSend() error {
	var err error
	s.out.close(func() { err = s.stream.CloseSend() })
	return err
}

// Close ends the stream at once (the rooms go on) and waits for its reader.
func (s *engineSession) Close() {
	s.cancel()
	for range s.roomEvents { //nolint:revive // drain so that receive returns
	}
	<-s.done
}

// one runs an op of one room and returns its result, or its error.
func (s *engineSession) one(ctx context.Context, op string, req *pb.EngineRequest) (sessionResult, error) {
	res, err := s.do(ctx, op, req)
	if err != nil {
		return sessionResult{}, err
	}
	if len(res) != 1 {
		return sessionResult{}, localError(op, codes.Internal, "the daemon answered %d results for one room", len(res))
	}
	return res[0], res[0].Err
}

// do sends an op and waits for its reply.
func (s *engineSession) do(ctx context.Context, op string, req *pb.EngineRequest) ([]sessionResult, error) {
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	req.Traceparent = carrier.Get("traceparent")
	ch := make(chan *pb.EngineReply, 1)
	var ended error
	queued := s.out.push(req, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.err != nil {
			ended = s.err
			return false
		}
		s.seq++
		req.Seq = s.seq
		s.pending[req.Seq] = ch
		return true
	})
	if !queued {
		if ended == nil { // CloseSend was called
			return nil, localError(op, codes.FailedPrecondition, "the session's sending side is closed (CloseSend)")
		}
		return nil, s.ended(op, ended)
	}
	var reply *pb.EngineReply
	select {
	case reply = <-ch:
	case <-s.done:
		select {
		case reply = <-ch: // answered before the stream ended (receive queued it first): the answer stands
		default:
			s.mu.Lock()
			err := s.err
			s.mu.Unlock()
			return nil, s.ended(op, err)
		}
	case <-ctx.Done():
		return nil, toError(op, ctx.Err())
	}
	if c := codes.Code(reply.GetCode()); c != codes.OK {
		return nil, newError(op, status.New(c, reply.GetMessage()))
	}
	out := make([]sessionResult, len(reply.GetResults()))
	for i, r := range reply.GetResults() {
		out[i] = sessionResult{Room: r.GetRoom(), Open: r.GetOpen(), Release: r.GetRelease(), Abort: r.GetAbort(), Declare: r.GetDeclare(), Err: resultError(op, r), Incarnation: reply.GetIncarnation()}
	}
	return out, nil
}

// ended is the error of an op on a stream that ended with err.
func (s *engineSession) ended(op string, err error) error {
	if errors.Is(err, io.EOF) {
		return localError(op, codes.FailedPrecondition, "the session ended")
	}
	return err
}

// resultError is a result's *Error (nil when OK), with its retry delay as
// a RetryInfo.
func resultError(op string, r *pb.EngineResult) error {
	c := codes.Code(r.GetCode())
	if c == codes.OK {
		return nil
	}
	st := status.New(c, r.GetMessage())
	if d := r.GetRetryAfter(); d != nil {
		if withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: d}); err == nil {
			st = withInfo
		}
	}
	if reason := r.GetReason(); reason != "" { // the unary RPC's ErrorInfo (PAGE_HELD)
		if withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errorDomain, Metadata: r.GetMetadata()}); err == nil {
			st = withInfo
		}
	}
	return newError(op, st)
}

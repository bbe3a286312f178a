package main

// The rooms suite over both transports: the stream and unary paths pass the
// same lifecycle, failure and abort tests. A test written once
// runs as two subtests, unary and stream (roomsOverBoth), each with its own
// daemon (its /metrics then counts that transport's ops only). The test
// drives rooms through roomsClient (the decode engine) and roomsRank (a
// prefill rank), whose room operations take the daemon's transport:
//
//	operation            unary                       stream
//	open a room          Rooms.OpenRoom              EngineSession Open
//	wait for a phase     Rooms.WatchRoom (WaitRoom)  the session's events (Watch for a room opened elsewhere)
//	release, abort       ReleaseRoom, AbortRoom      EngineSession Release, Abort
//	claim, destination   Rooms.AwaitDestination      PrefillSession Claim
//	chunk                Rooms.Transfer              PrefillSession Chunk
//	report               Rooms.ReportTransfer        PrefillSession Report
//	acknowledge          Rooms.AckRoomEnd            PrefillSession Ack
//	OpenAndWait,         client.TransportUnary       client.TransportStreams (the client's default)
//	SendRoom, ReportRoom
//
// The unary ops are the Go client's (Engine, Prefill); the stream ops are
// sent on the wire one at a time (internal/testing/sessiontest), since the
// Go client rides the sessions only inside OpenAndWait, SendRoom and
// ReportRoom: their refusals are the daemon's status (code and message),
// not a *client.Error.
//
// Every other call (GetRoom, ListRooms, GetStatus, LookupDPRanks, BindRoom,
// RetractRoom, Heartbeat) is the unary API on both: the sessions carry only
// the room's hand-off.
//
// At the end of each subtest the daemon's /metrics proves which transport
// carried the rooms: on stream, decodeplane_engine_session_ops_total and
// decodeplane_prefill_session_ops_total (hello and ping aside) moved by at
// least the ops the test sent on each side; on unary neither counter has a
// sample at all.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/testing/sessiontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// roomsTransport is how a test's rooms are carried (the zero value: unary,
// for the daemons of the tests that do not run over both).
type roomsTransport int

const (
	overUnary roomsTransport = iota
	overStream
)

func (tr roomsTransport) String() string {
	if tr == overStream {
		return "stream"
	}
	return "unary"
}

// clientTransport is the Go client's transport for SendRoom, ReportRoom and
// OpenAndWait.
func (tr roomsTransport) clientTransport() client.Transport {
	if tr == overStream {
		return client.TransportStreams
	}
	return client.TransportUnary
}

// roomsOverBoth runs f as two parallel subtests, unary and stream.
func roomsOverBoth(t *testing.T, f func(t *testing.T, tr roomsTransport)) {
	t.Helper()
	for _, tr := range []roomsTransport{overUnary, overStream} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			f(t, tr)
		})
	}
}

// ---- the decode engine's side ----

// roomsClient is a client of the daemon whose OpenRoom, WaitRoom, AbortRoom
// and ReleaseRoom take the daemon's transport (on stream: an EngineSession
// of its own); its other room calls are the unary API's on both.
type roomsClient struct {
	*client.Client
	d     *roomsDaemon
	token string       // the client's token ("": none), for its sessions
	eng   *engineWatch // stream only
}

// callOpts are the call options of a session of the client: its token.
func (c *roomsClient) callOpts() []grpc.CallOption {
	if c.token == "" {
		return nil
	}
	return []grpc.CallOption{sessiontest.WithToken(c.token)}
}

// GetRoom is Admin.GetRoom.
func (c *roomsClient) GetRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	return c.Admin().GetRoom(ctx, req)
}

// ListRooms is Admin.ListRooms.
func (c *roomsClient) ListRooms(ctx context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	return c.Admin().ListRooms(ctx, req)
}

// Status is Admin.Status.
func (c *roomsClient) Status(ctx context.Context) (*pb.GetStatusResponse, error) {
	return c.Admin().Status(ctx)
}

// LookupDPRanks is Engine.LookupDPRanks.
func (c *roomsClient) LookupDPRanks(ctx context.Context, req *pb.LookupDPRanksRequest) (*pb.LookupDPRanksResponse, error) {
	return c.Engine().LookupDPRanks(ctx, req)
}

// RetractRoom is Engine.RetractRoom.
func (c *roomsClient) RetractRoom(ctx context.Context, req *pb.RetractRoomRequest) (*pb.RetractRoomResponse, error) {
	return c.Engine().RetractRoom(ctx, req)
}

// count records an engine-side op sent on the transport, unless it was
// refused Unauthenticated (on stream the interceptor refuses the session as
// a whole, before any op reaches it: the daemon counts none).
func (c *roomsClient) count(err error) {
	if status.Code(err) != codes.Unauthenticated {
		c.d.engineOps.Add(1)
	}
}

// OpenRoom opens a room (EngineSession Open on stream: the room is then
// subscribed on c's session).
func (c *roomsClient) OpenRoom(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	if c.eng == nil {
		resp, err := c.Engine().OpenRoom(ctx, req)
		c.count(err)
		return resp, err
	}
	resp, err := c.eng.open(ctx, req)
	c.count(err)
	return resp, err
}

// OpenAndWait is client.Engine.OpenAndWait with the client built for the
// daemon's transport (client.WithTransport). It counts one engine hand-off
// (at least its open op) for the metrics check: on stream that check fails
// until OpenAndWait rides the engine session under TransportStreams.
func (c *roomsClient) OpenAndWait(ctx context.Context, req *pb.OpenRoomRequest) (*pb.Room, error) {
	c.d.engineHandOffs.Add(1)
	return c.Engine().OpenAndWait(ctx, req)
}

// WaitRoom is client.WaitRoom's contract (the room once it reached one of
// phases, or its end; a failure as a *client.RoomFailedError) over the
// transport.
func (c *roomsClient) WaitRoom(ctx context.Context, room uint64, phases ...pb.RoomPhase) (*pb.Room, error) {
	if c.eng == nil {
		return c.Engine().WaitRoom(ctx, room, phases...)
	}
	return c.eng.wait(ctx, c, room, phases)
}

// AbortRoom aborts a room (EngineSession Abort on stream).
func (c *roomsClient) AbortRoom(ctx context.Context, req *pb.AbortRoomRequest) (*pb.AbortRoomResponse, error) {
	if c.eng == nil {
		resp, err := c.Engine().AbortRoom(ctx, req)
		c.count(err)
		return resp, err
	}
	resp, err := c.eng.s.Abort(ctx, req)
	c.count(err)
	return resp, err
}

// ReleaseRoom releases a room (EngineSession Release on stream).
func (c *roomsClient) ReleaseRoom(ctx context.Context, req *pb.ReleaseRoomRequest) (*pb.ReleaseRoomResponse, error) {
	if c.eng == nil {
		resp, err := c.Engine().ReleaseRoom(ctx, req)
		c.count(err)
		return resp, err
	}
	resp, err := c.eng.s.Release(ctx, req)
	c.count(err)
	return resp, err
}

// engineWatch is a client's EngineSession and the events it received, kept
// per room, in order, for WaitRoom (a room's waits replay its events from
// the first, as WatchRoom with history does).
type engineWatch struct {
	s *sessiontest.Engine

	mu         sync.Mutex
	events     map[uint64][]*pb.RoomEvent
	subscribed map[uint64]bool
	changed    chan struct{} // closed (and replaced) on every event and at the end
	end        error         // the session's end (Next's error)
	done       chan struct{} // closed when the reader returned
}

// startEngineWatch opens c's session and its reader; both end at cleanup.
func startEngineWatch(t *testing.T, c *roomsClient) *engineWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := sessiontest.OpenEngine(ctx, c.Conn(), c.callOpts()...)
	if err != nil {
		cancel()
		t.Fatalf("EngineSession: %v", err)
	}
	w := &engineWatch{s: s, events: map[uint64][]*pb.RoomEvent{}, subscribed: map[uint64]bool{},
		changed: make(chan struct{}), done: make(chan struct{})}
	go w.read()
	t.Cleanup(func() {
		s.Close()
		cancel()
		<-w.done
	})
	return w
}

func (w *engineWatch) read() {
	defer close(w.done)
	for {
		ev, err := w.s.Next()
		w.mu.Lock()
		if err != nil {
			w.end = err
		} else {
			w.events[ev.GetRoom()] = append(w.events[ev.GetRoom()], ev.GetEvent())
		}
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func (w *engineWatch) open(ctx context.Context, req *pb.OpenRoomRequest) (*pb.OpenRoomResponse, error) {
	resp, err := w.s.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	w.subscribed[req.GetRoom()] = true
	w.mu.Unlock()
	return resp, nil
}

// wait is client.Engine.WaitRoom over the session's events. A room this
// session did not open is subscribed first (Watch from its first event).
func (w *engineWatch) wait(ctx context.Context, c *roomsClient, room uint64, phases []pb.RoomPhase) (*pb.Room, error) {
	w.mu.Lock()
	sub := w.subscribed[room]
	w.subscribed[room] = true
	w.mu.Unlock()
	if !sub {
		err := w.s.Watch(ctx, room, 0)
		c.count(err)
		if err != nil {
			w.mu.Lock()
			delete(w.subscribed, room)
			w.mu.Unlock()
			return nil, err
		}
	}
	for i := 0; ; {
		w.mu.Lock()
		evs, changed, end := w.events[room], w.changed, w.end
		w.mu.Unlock()
		for ; i < len(evs); i++ {
			ev := evs[i]
			r := ev.GetRoom()
			ph := ev.GetTransition().GetPhase()
			if ev.GetTransition() == nil {
				ph = r.GetPhase()
			}
			if slices.Contains(phases, ph) {
				return r, nil
			}
			if !ev.GetTerminal() {
				continue
			}
			if ph == pb.RoomPhase_ROOM_PHASE_FAILED {
				f := r.GetFailure()
				return r, &client.RoomFailedError{Room: room, Code: f.GetCode(), Message: f.GetMessage(), FromAnotherRank: f.GetFromAnotherRank()}
			}
			if len(phases) == 0 {
				return r, nil
			}
			return r, fmt.Errorf("room %d ended in %s before reaching %v", room, ph, phases)
		}
		if end != nil {
			if errors.Is(end, io.EOF) {
				end = fmt.Errorf("room %d: the engine session ended before the room did", room)
			}
			return nil, end
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// ---- the prefill rank's side ----

// roomsClaim is a claim's events: an AwaitDestination stream (unary) or a
// session's claim (stream).
type roomsClaim interface {
	Next() (*client.Event, error)
	Close()
}

// sessionClaim is a claim on the rank's session, read as a
// client.DestinationStream is: the destination, then Done; the room's
// failure as a *client.RoomFailedError.
type sessionClaim struct {
	*sessiontest.Claim
	room uint64
}

// Next returns the claim's next event.
func (c sessionClaim) Next() (*client.Event, error) {
	for {
		ev, err := c.Claim.Next()
		if err != nil {
			return nil, err
		}
		switch {
		case ev.GetDestination() != nil:
			return &client.Event{Destination: ev.GetDestination()}, nil
		case ev.GetDone() != nil:
			return &client.Event{Done: ev.GetDone()}, nil
		case ev.GetFailure() != nil:
			f := ev.GetFailure()
			return nil, &client.RoomFailedError{Room: c.room, Code: f.GetCode(), Message: f.GetMessage(),
				FromAnotherRank: f.GetFromAnotherRank(), AckRequired: ev.GetAckRequired()}
		}
	}
}

// openSession opens a prefill session of the rank (its hello).
func (r *roomsRank) openSession(ctx context.Context) (*sessiontest.Prefill, error) {
	hello := &pb.PrefillHello{Rank: r.Rank(), InstanceId: r.instance, Incarnation: r.Incarnation()}
	return sessiontest.OpenPrefill(ctx, r.c.Conn(), hello, r.c.callOpts()...)
}

// session is the rank's prefill session, opened on first use (a rank whose
// test only calls SendRoom opens none here: on stream, SendRoom is the
// client's, over its own streams). The session ends with stop.
func (r *roomsRank) session() (*sessiontest.Prefill, error) {
	r.sessMu.Lock()
	defer r.sessMu.Unlock()
	if r.sess == nil && r.sessErr == nil {
		r.sess, r.sessErr = r.openSession(r.sessCtx)
	}
	return r.sess, r.sessErr
}

// claim claims room for the rank and returns its events.
func (r *roomsRank) claim(ctx context.Context, room uint64) (roomsClaim, error) {
	req := &pb.AwaitDestinationRequest{Room: room, Rank: r.Rank()}
	r.d.prefillOps.Add(1)
	if r.tr == overUnary {
		return r.AwaitDestination(ctx, req)
	}
	s, err := r.session()
	if err != nil {
		return nil, err
	}
	c, err := s.Claim(ctx, req)
	if err != nil {
		return nil, err
	}
	return sessionClaim{Claim: c, room: room}, nil
}

// chunk is one Transfer of the rank.
func (r *roomsRank) chunk(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	r.d.prefillOps.Add(1)
	if r.tr == overUnary {
		return r.Transfer(ctx, req)
	}
	s, err := r.session()
	if err != nil {
		return nil, err
	}
	return s.Chunk(ctx, req)
}

// report is one ReportTransfer of the rank.
func (r *roomsRank) report(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	r.d.prefillOps.Add(1)
	if r.tr == overUnary {
		return r.ReportTransfer(ctx, req)
	}
	s, err := r.session()
	if err != nil {
		return nil, err
	}
	return s.Report(ctx, req)
}

// ack is the rank's AckRoomEnd of dest's generation.
func (r *roomsRank) ack(ctx context.Context, dest *pb.Destination) (*pb.AckRoomEndResponse, error) {
	r.d.prefillOps.Add(1)
	if r.tr == overUnary {
		return r.AckRoomEnd(ctx, dest.GetRoom(), dest)
	}
	s, err := r.session()
	if err != nil {
		return nil, err
	}
	return s.Ack(ctx, &pb.AckRoomEndRequest{Room: dest.GetRoom(), Rank: r.Rank(), Attempt: dest.GetAttempt(), Incarnation: dest.GetIncarnation()})
}

// SendRoom is client.Prefill.SendRoom with the rank's client built for the
// daemon's transport (client.WithTransport). It counts one hand-off (at
// least its claim op) for the metrics check: on stream that check fails
// until SendRoom rides the prefill session under TransportStreams.
func (r *roomsRank) SendRoom(ctx context.Context, room uint64, o client.SendOptions) (*pb.Destination, error) {
	r.d.handOffs.Add(1)
	return r.Prefill.SendRoom(ctx, room, o)
}

// ReportRoom is client.Prefill.ReportRoom, as SendRoom.
func (r *roomsRank) ReportRoom(ctx context.Context, room uint64, o client.SendOptions) (*pb.Destination, error) {
	r.d.handOffs.Add(1)
	return r.Prefill.ReportRoom(ctx, room, o)
}

// ---- the proof: the daemon's session counters ----

// sessionOps sums the samples of counter name on the daemon's /metrics,
// leaving out the ops of the label values in skip (op="hello", …); a
// counter with no sample is 0.
func (d *roomsDaemon) sessionOps(t *testing.T, name string, skip ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.metricsAddr + "/metrics")
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
sample:
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(line, "} ")
		if !ok {
			t.Fatalf("/metrics: malformed sample %q", sc.Text())
		}
		for _, op := range skip {
			if strings.Contains(","+labels+",", `,op="`+op+`",`) {
				continue sample
			}
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			t.Fatalf("/metrics: sample %q: %v", sc.Text(), err)
		}
		sum += f
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	return sum
}

const (
	engineSessionOps  = "decodeplane_engine_session_ops_total"
	prefillSessionOps = "decodeplane_prefill_session_ops_total"
)

// assertCarried checks that the daemon's session counters match its
// transport: on unary no session op at all (hello and ping included); on
// stream at least as many engine and prefill ops (hello and ping aside) as
// the test sent on each side, an OpenAndWait counting one (its open), a
// SendRoom or ReportRoom one (its claim). It runs at the test's end (cleanup), while the daemon still runs.
func (d *roomsDaemon) assertCarried(t *testing.T) {
	t.Helper()
	eng, pre := d.sessionOps(t, engineSessionOps), d.sessionOps(t, prefillSessionOps, "hello", "ping")
	sentEng, engHandOffs := float64(d.engineOps.Load()), float64(d.engineHandOffs.Load())
	sentOps, handOffs := float64(d.prefillOps.Load()), float64(d.handOffs.Load())
	sentPre := sentOps + handOffs
	switch d.tr {
	case overUnary:
		if all := d.sessionOps(t, prefillSessionOps); eng != 0 || all != 0 {
			t.Errorf("unary: the daemon counted %v engine session ops and %v prefill session ops, want none", eng, all)
		}
	case overStream:
		if sentEng+engHandOffs+sentPre == 0 {
			t.Error("stream: the test sent no room op on the transport; the check proves nothing")
		}
		switch {
		case eng < sentEng:
			t.Errorf("stream: %s = %v, want ≥ %v (the engine ops the test sent): the rooms did not ride the engine session", engineSessionOps, eng, sentEng)
		case eng < sentEng+engHandOffs:
			t.Errorf("stream: %s = %v, want ≥ %v (%v ops on the engine sessions + %v OpenAndWait): OpenAndWait under client.TransportStreams did not ride the engine session", engineSessionOps, eng, sentEng+engHandOffs, sentEng, engHandOffs)
		}
		switch {
		case pre < sentOps:
			t.Errorf("stream: %s (hello, ping aside) = %v, want ≥ %v (the claims, chunks and reports the test sent on the ranks' sessions)", prefillSessionOps, pre, sentOps)
		case pre < sentPre:
			t.Errorf("stream: %s (hello, ping aside) = %v, want ≥ %v (%v ops on the ranks' sessions + %v SendRoom/ReportRoom): SendRoom/ReportRoom under client.TransportStreams did not ride the prefill session", prefillSessionOps, pre, sentPre, sentOps, handOffs)
		}
	}
	t.Logf("%s: session ops counted by the daemon: engine %v (test sent %v ops and %v OpenAndWait), prefill %v (test sent %v ops and %v SendRoom/ReportRoom)", d.tr, eng, sentEng, engHandOffs, pre, sentOps, handOffs)
}

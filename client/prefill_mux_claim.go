package client

import (
	"context"
	"errors"
	"io"
	"sync"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The hand-off's ops on the rank's shared session: each is sent again on
// the next session when the one it was on ended under it (muxDo, muxClaim).

// endedUnder reports that err is s's end, not an answer: s ended and err
// carries its status (or io.EOF, a claim cut by an OK end), while the
// caller's ctx lives. A refusal the daemon sent just before the end would
// be taken for it and sent again, which the daemon's idempotency rules
// make harmless.
func endedUnder(ctx context.Context, s *prefillSession, err error) bool {
	if err == nil || ctx.Err() != nil || s.Err() == nil { // Err: set once the session ended
		return false
	}
	var rf *RoomFailedError
	var ic *IncarnationChangedError
	if errors.As(err, &rf) || errors.As(err, &ic) {
		return false
	}
	if errors.Is(err, io.EOF) {
		return true
	}
	var got, end *Error
	if !errors.As(err, &got) || !errors.As(sessionEnded(muxOp, s.Err()), &end) {
		return false
	}
	return got.Code() == end.Code()
}

// muxDo runs call on the shared session, on a new one when the session
// ended under it (at most MaxAttempts sessions).
func muxDo[R any](ctx context.Context, m *prefillMux, call func(*prefillSession) (R, error)) (R, error) {
	for n := 1; ; n++ {
		s, err := m.get(ctx)
		if err != nil {
			var zero R
			return zero, err
		}
		r, err := call(s)
		if err == nil || n >= m.p.c.retry.MaxAttempts || !endedUnder(ctx, s, err) {
			return r, err
		}
	}
}

// chunk is Transfer on the shared session.
func (m *prefillMux) chunk(ctx context.Context, req *pb.TransferRequest) (*pb.TransferResponse, error) {
	return muxDo(ctx, m, func(s *prefillSession) (*pb.TransferResponse, error) { return s.Chunk(ctx, req) })
}

// report is ReportTransfer on the shared session.
func (m *prefillMux) report(ctx context.Context, req *pb.ReportTransferRequest) (*pb.ReportTransferResponse, error) {
	return muxDo(ctx, m, func(s *prefillSession) (*pb.ReportTransferResponse, error) { return s.Report(ctx, req) })
}

// transport is the hand-off's claim and acknowledgement on the shared
// session.
func (m *prefillMux) transport() handTransport {
	p := m.p
	return handTransport{
		claim: func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error) {
			cctx, cancel := context.WithCancel(ctx)
			c := &muxClaim{m: m, ctx: cctx, cancel: cancel, req: req}
			if err := c.attach(); err != nil {
				cancel()
				return nil, err
			}
			return c, nil
		},
		ack: func(ctx context.Context, room uint64, dest *pb.Destination) error {
			req := &pb.AckRoomEndRequest{Room: room, Rank: p.rank, Attempt: dest.GetAttempt(), Incarnation: dest.GetIncarnation()}
			_, err := muxDo(ctx, m, func(s *prefillSession) (*pb.AckRoomEndResponse, error) { return s.Ack(ctx, req) })
			return err
		},
	}
}

// muxClaim is a hand-off's claim on the shared session, made again on the
// next session when the one it was on ended. Next is called from one
// goroutine at a time; Close from any.
type muxClaim struct {
	m      *prefillMux
	ctx    context.Context // ends with Close
	cancel context.CancelFunc
	req    *pb.AwaitDestinationRequest

	mu     sync.Mutex
	cur    *sessionClaim
	sess   *prefillSession
	closed bool

	// Next's own state.
	seen    bool
	attempt uint32 // of the last destination returned
	fails   int    // consecutive sessions that ended under the claim
}

// attach claims on the live session (a new one if needed).
func (c *muxClaim) attach() error {
	for {
		s, err := c.m.getHandOff(c.ctx)
		if err != nil {
			return err
		}
		sc, err := s.Claim(c.ctx, c.req)
		if err != nil {
			if c.fails+1 < c.m.p.c.retry.MaxAttempts && endedUnder(c.ctx, s, err) {
				c.fails++
				continue
			}
			return err
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			sc.Close()
			return io.EOF
		}
		c.cur, c.sess = sc, s
		c.mu.Unlock()
		return nil
	}
}

// Next returns the claim's next event, as sessionClaim.Next does; a
// destination re-delivered after a re-claim (same attempt) is not returned
// twice.
func (c *muxClaim) Next() (*Event, error) {
	for {
		c.mu.Lock()
		cur, s := c.cur, c.sess
		c.mu.Unlock()
		ev, err := cur.Next()
		if err == nil {
			if d := ev.Destination; d != nil {
				if c.seen && d.GetAttempt() == c.attempt {
					continue // re-delivered after a re-claim
				}
				c.seen, c.attempt = true, d.GetAttempt()
			}
			c.fails = 0
			return ev, nil
		}
		c.mu.Lock()
		closed := c.closed
		c.mu.Unlock()
		if closed || c.fails+1 >= c.m.p.c.retry.MaxAttempts || !endedUnder(c.ctx, s, err) {
			return nil, err
		}
		c.fails++
		if aerr := c.attach(); aerr != nil {
			if errors.Is(aerr, io.EOF) {
				return nil, io.EOF
			}
			return nil, aerr
		}
	}
}

// Close withdraws the claim from the session (the daemon keeps a delivered
// destination claimed) and ends a re-claim in progress.
func (c *muxClaim) Close() {
	c.mu.Lock()
	c.closed = true
	cur := c.cur
	c.mu.Unlock()
	c.cancel()
	if cur != nil {
		cur.Close()
	}
}

// transportOffered is the transport of a hand-off of a room a daemon
// offered the rank (FleetPrefill): its claim is the offer (first, on
// session s) while that session lives, then a claim on the next one, as a
// muxClaim's; with no offer (a route), a claim on the shared session.
// used reports whether the hand-off took the offer (its Close then ends
// it).
func (m *prefillMux) transportOffered(first *sessionClaim, s *prefillSession) (tr handTransport, used func() bool) {
	tr = m.transport()
	if first == nil {
		return tr, func() bool { return true }
	}
	claim := tr.claim
	var took bool
	tr.claim = func(ctx context.Context, req *pb.AwaitDestinationRequest) (claimStream, error) {
		if took {
			return claim(ctx, req)
		}
		took = true
		cctx, cancel := context.WithCancel(ctx)
		first.endWith(cctx)
		return &muxClaim{m: m, ctx: cctx, cancel: cancel, req: req, cur: first, sess: s}, nil
	}
	return tr, func() bool { return took }
}

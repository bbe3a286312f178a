package client

import (
	"context"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// What the external tests (package client_test) reach of the package's
// internals: the two multiplexed sessions the roles ride (engineSession,
// prefillSession), to test them over a real daemon, and hooks into the
// Client's shared sessions.

// EngineSession is the decode engine's multiplexed stream.
type EngineSession = engineSession

// SessionResult is one room's answer to an op of an EngineSession.
type SessionResult = sessionResult

// EngineSessionOption configures an EngineSession.
type EngineSessionOption = engineSessionOption

// SessionEvents chooses which events an EngineSession subscribes.
func SessionEvents(e pb.EngineEvents) EngineSessionOption { return sessionEvents(e) }

// OpenEngineSession opens an engine session on c, as OpenAndWait's shared
// session is opened.
func OpenEngineSession(ctx context.Context, c *Client, opts ...EngineSessionOption) (*EngineSession, error) {
	return c.openEngineSession(ctx, opts...)
}

// Session is a prefill rank's multiplexed stream.
type Session = prefillSession

// SessionClaim is one room's claim on a Session.
type SessionClaim = sessionClaim

// OpenSession opens a prefill session of p's rank, as its shared session
// is opened.
func OpenSession(ctx context.Context, p *Prefill) (*Session, error) { return p.openSession(ctx) }

// SendRoomSession is SendRoom over sess, a session of p: the hand-off's
// state machine over a session the test holds.
func SendRoomSession(ctx context.Context, p *Prefill, sess *Session, room uint64, o SendOptions) (*pb.Destination, error) {
	return p.handOffOver(ctx, "SendRoomSession", room, o, sess.transport(), p.transferMove(room, o, sess.Chunk))
}

// ReportRoomSession is ReportRoom over sess, a session of p.
func ReportRoomSession(ctx context.Context, p *Prefill, sess *Session, room uint64, o SendOptions) (*pb.Destination, error) {
	return p.handOffOver(ctx, "ReportRoomSession", room, o, sess.transport(), p.reportMove(room, o, sess.Report))
}

// CloseRankSession ends p's shared session for good, as Client.Close ends
// every rank's.
func CloseRankSession(p *Prefill) { p.mux.close() }

// OnOpenQueued makes c's shared engine session tell f how many opens wait
// for their batch, after each open is queued. Call it before c's first
// OpenAndWait.
func OnOpenQueued(c *Client, f func(n int)) { c.engineMux.queued = f }

// WaitingRooms is how many rooms c's shared engine session hands events to.
func WaitingRooms(c *Client) int {
	c.engineMux.mu.Lock()
	defer c.engineMux.mu.Unlock()
	return len(c.engineMux.rooms)
}

// EngineSessionPacks reports, once s read the daemon's response header,
// whether s packs its requests (the daemon said it reads them).
func EngineSessionPacks(s *EngineSession) bool {
	<-s.negotiated
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	return s.out.max > 1
}

// SessionPacks reports whether s packs its requests.
func SessionPacks(s *Session) bool {
	s.out.mu.Lock()
	defer s.out.mu.Unlock()
	return s.out.max > 1
}

package client

// OnOpenQueued makes c's shared engine session tell f how many opens wait
// for their batch, after each open is queued. Call it before c's first
// OpenAndWait.
func OnOpenQueued(c *Client, f func(n int)) { c.engine.queued = f }

// WaitingRooms is how many rooms c's shared engine session hands events to.
func WaitingRooms(c *Client) int {
	c.engine.mu.Lock()
	defer c.engine.mu.Unlock()
	return len(c.engine.rooms)
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

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

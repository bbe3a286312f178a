package session

// SetReplayQueuedHook installs replayQueuedHook for a test; the returned
// func removes it.
func SetReplayQueuedHook(f func(queued int)) (restore func()) {
	replayQueuedHook = f
	return func() { replayQueuedHook = nil }
}

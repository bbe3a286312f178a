package client

// Transport is how a Client carries a room's hand-off: OpenAndWait on the
// decode side, Prefill.SendRoom and Prefill.ReportRoom on the prefill side.
// Every other method is a unary RPC (or a server stream) whatever the
// transport. Both transports drive the daemon's one state machine: a room
// opened on one can be watched, aborted, released or looked up on the other
// (decodectl sees no difference).
type Transport uint8

const (
	// TransportStreams (the default) carries rooms on long-lived
	// multiplexed streams the Client keeps: OpenAndWait (and ReleaseRoom
	// and AbortRoom while it is up) on the Client's shared
	// EngineSession.Session stream, SendRoom and ReportRoom on the rank's
	// shared PrefillSession.Session stream (whose liveness is also the
	// rank's heartbeat while it is open).
	TransportStreams Transport = iota
	// TransportUnary carries them on one RPC per step: OpenRoom then
	// WatchRoom; AwaitDestination, Transfer per chunk, ReportTransfer and
	// AckRoomEnd. For peers that cannot hold a stream open (some proxies)
	// and for comparison.
	TransportUnary
)

// String names the transport as the bench's --api flag does.
func (t Transport) String() string {
	switch t {
	case TransportStreams:
		return "stream"
	case TransportUnary:
		return "unary"
	}
	return "Transport(?)"
}

// WithTransport chooses how rooms are carried (see Transport); the default
// is TransportStreams.
func WithTransport(t Transport) Option {
	return func(o *options) { o.transport = t }
}

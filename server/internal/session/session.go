// Package session serves decodeplane's two multiplexed sessions,
// EngineSession (engine.go) and PrefillSession (prefill.go): a transport
// for the operation table's ops (package ops), not a second set of
// handlers. Each op is checked by its table op (CheckAs: the request's
// bounds, its fields prefixed with the op's name in the session, and its
// incarnation) and runs the op's call; the stream as a whole was
// authorized by the server's interceptor. A session adds only its framing
// (seq, results and replies), the multiplexing of its rooms' events and
// flow control.
//
// # Goroutines
//
// A session runs on one goroutine per direction however many rooms it
// claims, watches or moves chunks for: the receiving one reads the ops
// and runs them in order, the sending one sends one bounded outbox in
// order; the handler's own goroutine only decides when the stream ends
// (so that it can end the stream while a send is blocked on a client that
// does not read). The rooms' events come from the room manager through
// sinks (kvmanager.ClaimSink, kvmanager.WatchSink) that append to the
// outbox without blocking, and a chunk's transfer ends with a callback
// (ops.Table.TransferAsync) that queues its result.
package session

import (
	"context"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server/internal/ops"
)

// Config is what both sessions are built from.
type Config struct {
	// Ops is the operation table.
	Ops *ops.Table
	// Stop is done once the server stops serving (Shutdown): a session
	// sends what it queued (its rooms' last events among it) and ends OK.
	Stop context.Context
	// Tracer starts the prefill session's op spans; nil when tracing is
	// off.
	Tracer trace.Tracer
	// Propagator extracts an op's W3C trace context.
	Propagator propagation.TextMapPropagator
	// Engine and Prefill count the sessions' ops; nil counts nothing.
	Engine  EngineMetrics
	Prefill PrefillMetrics
}

// negotiatePack runs a session's packing negotiation (pb.PackKey) when the
// stream starts: it tells the client, in the response header, that the
// daemon reads packed requests, and reports whether the client asked for
// packed events. A client that did not ask gets one entry per message:
// a client written before packing, or from the proto without reading
// `more`, loses nothing.
func negotiatePack(stream grpc.ServerStream) bool {
	// An error means the stream already ended: its Recv says so.
	_ = stream.SendHeader(metadata.Pairs(pb.PackKey, pb.PackMore))
	md, _ := metadata.FromIncomingContext(stream.Context())
	return slices.Contains(md.Get(pb.PackKey), pb.PackMore)
}

// prefixInvalid is a session op's refusal by its table op's call with the
// op's field prefix ("chunk.", "open.rooms[3].") on every line of an
// INVALID_ARGUMENT message that names a field ("page_offset: ..."), as the
// op's own bounds are named (the protos: the fields "prefixed with the
// op"); a line that names none (SGLang's "Request ... exceeds the maximum
// number of tokens") stays as it is, as do other codes and the details.
func prefixInvalid(prefix string, err error) error {
	st, ok := status.FromError(err)
	if err == nil || !ok || st.Code() != codes.InvalidArgument {
		return err
	}
	sp := st.Proto() // a copy: the details stay
	lines := strings.Split(sp.GetMessage(), "\n")
	for i, l := range lines {
		if namesField(l) {
			lines[i] = prefix + l
		}
	}
	sp.Message = strings.Join(lines, "\n")
	return status.FromProto(sp).Err()
}

// namesField reports whether a refusal's line starts with a field path and
// a colon ("rank.bootstrap_addr: ...", "rooms[0].room: ...").
func namesField(line string) bool {
	field, _, ok := strings.Cut(line, ": ")
	if !ok || field == "" || field[0] < 'a' || field[0] > 'z' {
		return false
	}
	for _, r := range field {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == '[' || r == ']') {
			return false
		}
	}
	return true
}

// signal wakes a goroutine waiting on c (capacity 1) without blocking.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

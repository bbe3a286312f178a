package server

import (
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

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

// prefixInvalid is a session op's refusal by its unary handler with the
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

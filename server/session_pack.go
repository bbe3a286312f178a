package server

import (
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

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

package client

import (
	"context"

	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Release, abort and declare over the shared engine session.
//
// Under TransportStreams, ReleaseRoom, AbortRoom and DeclareDestination ride OpenAndWait's
// shared EngineSession when it is up (one message each way, packed with
// whatever else is in flight, instead of a call per room), and are the
// unary RPCs otherwise: no session is opened for them alone. Their answers
// are the unary RPC's (the same response, or the same *Error: code,
// message without the op's "release."/"abort." field prefix, details).
// Both are idempotent, so an op whose session ended before its answer is
// sent again as the unary RPC.

// releaseOnSession is ReleaseRoom on the shared session; ok false: no
// session was up or it ended under the op (the caller goes unary).
func (c *Client) releaseOnSession(ctx context.Context, req *pb.ReleaseRoomRequest) (resp *pb.ReleaseRoomResponse, ok bool, err error) {
	const op = "ReleaseRoom"
	// A copy: an op whose ctx ended returns while its request may still
	// wait in the session's queue (the unary call is done with it on return).
	req = proto.CloneOf(req)
	if req == nil {
		req = &pb.ReleaseRoomRequest{} // as the unary call marshals nil
	}
	res, ok, err := c.engineOp(ctx, "EngineSession.Release", &pb.EngineRequest{Op: &pb.EngineRequest_Release{Release: req}})
	if !ok {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, reop(op, unprefix(err, "release."))
	}
	return res.Release, true, nil
}

// abortOnSession is AbortRoom on the shared session (see
// releaseOnSession).
func (c *Client) abortOnSession(ctx context.Context, req *pb.AbortRoomRequest) (resp *pb.AbortRoomResponse, ok bool, err error) {
	const op = "AbortRoom"
	req = proto.CloneOf(req) // as releaseOnSession
	if req == nil {
		req = &pb.AbortRoomRequest{}
	}
	res, ok, err := c.engineOp(ctx, "EngineSession.Abort", &pb.EngineRequest{Op: &pb.EngineRequest_Abort{Abort: req}})
	if !ok {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, reop(op, unprefix(err, "abort."))
	}
	return res.Abort, true, nil
}

// declareOnSession is DeclareDestination on the shared session (see
// releaseOnSession; a repeated declaration answers already).
func (c *Client) declareOnSession(ctx context.Context, req *pb.DeclareDestinationRequest) (resp *pb.DeclareDestinationResponse, ok bool, err error) {
	const op = "DeclareDestination"
	req = proto.CloneOf(req) // as releaseOnSession
	if req == nil {
		req = &pb.DeclareDestinationRequest{}
	}
	res, ok, err := c.engineOp(ctx, "EngineSession.Declare", &pb.EngineRequest{Op: &pb.EngineRequest_Declare{Declare: req}})
	if !ok {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, reop(op, unprefix(err, "declare."))
	}
	return res.Declare, true, nil
}

// engineOp runs a one-room op on the shared session if one is up: its
// result (err: the room's refusal, the op's refusal as a whole, or ctx's
// end), or ok false when there is no session or it ended before the
// answer.
func (c *Client) engineOp(ctx context.Context, op string, req *pb.EngineRequest) (sessionResult, bool, error) {
	if c.transport != TransportStreams || c.closed.Load() {
		return sessionResult{}, false, nil
	}
	ms := c.engineMux.live()
	if ms == nil {
		return sessionResult{}, false, nil
	}
	res, err := ms.s.one(ctx, op, req)
	if err != nil && ctx.Err() == nil && ms.s.over() && res.Room == 0 {
		return sessionResult{}, false, nil // the session's end, not an answer
	}
	if err != nil && ctx.Err() != nil && res.Room == 0 {
		return sessionResult{}, true, ctxEnd(op, ctx.Err())
	}
	return res, true, err
}

// over reports whether the stream ended.
func (s *engineSession) over() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

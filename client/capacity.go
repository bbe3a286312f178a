package client

import (
	"context"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// CapacityOptions are a WatchCapacity stream's intervals. Zero is the
// daemon's default (100ms, 10s); the daemon refuses values outside
// 10ms..60s and 1s..10m, or a keepalive below the min interval, with
// ErrInvalidArgument naming the field.
type CapacityOptions struct {
	// MinInterval is the least time between two updates.
	MinInterval time.Duration
	// Keepalive is the most time between two updates: a router that hears
	// nothing for longer (twice as long, to allow for the network) should
	// take the daemon for gone.
	Keepalive time.Duration
}

// CapacityStream is a WatchCapacity stream (see Admin.WatchCapacity). Next
// must be called from one goroutine at a time; Close may be called from
// any.
type CapacityStream struct {
	st     grpc.ServerStreamingClient[pb.CapacityUpdate]
	cancel context.CancelFunc
	op     string
	err    error
}

// WatchCapacity streams the daemon's capacity, per decode DP shard: the
// current figures at once, then an update when a figure changed (at most
// one per opts.MinInterval) and at least one per opts.Keepalive. Each
// update carries the daemon's incarnation (a change means it restarted and
// every room it held is gone), readiness and draining flag. See the
// example for how a router picks a decode instance from it.
//
// The stream is not re-opened when it ends: its end is what tells a router
// that the daemon stopped (the last update had ready=false) or cannot be
// reached. Call WatchCapacity again (with a back-off) to resume; each new
// stream starts with the current figures. Needs the token when the daemon
// has one.
func (a *Admin) WatchCapacity(ctx context.Context, opts CapacityOptions) (*CapacityStream, error) {
	c := a.c
	op := opName(pb.Capacity_WatchCapacity_FullMethodName)
	if err := c.errIfClosed(op); err != nil {
		return nil, err
	}
	req := &pb.WatchCapacityRequest{}
	if opts.MinInterval != 0 {
		req.MinInterval = durationpb.New(opts.MinInterval)
	}
	if opts.Keepalive != 0 {
		req.KeepaliveInterval = durationpb.New(opts.Keepalive)
	}
	sctx, cancel := context.WithCancel(ctx)
	st, err := c.capacity.WatchCapacity(sctx, req, c.callOpts...)
	if err != nil {
		cancel()
		return nil, toError(op, err)
	}
	return &CapacityStream{st: st, cancel: cancel, op: op}, nil
}

// Next returns the next update. After the daemon ended the stream (it
// stopped) Next returns io.EOF; any other end is an *Error
// (ErrInvalidArgument for an interval out of bounds, ErrUnauthenticated,
// ErrUnavailable when the daemon is unreachable, ErrCanceled after Close or
// the context's end). After an error every call returns it again.
func (s *CapacityStream) Next() (*pb.CapacityUpdate, error) {
	if s.err != nil {
		return nil, s.err
	}
	u, err := s.st.Recv()
	if err != nil {
		if err == io.EOF {
			s.err = io.EOF
		} else {
			s.err = toError(s.op, err)
		}
		s.cancel()
		return nil, s.err
	}
	return u, nil
}

// Close ends the stream.
func (s *CapacityStream) Close() { s.cancel() }

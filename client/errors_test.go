package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// ---- errors ----

// TestErrorFamilies checks each family against the real daemon and domain:
// errors.Is on the client sentinel, status.Code, and the message.
func TestErrorFamilies(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	ctx := ctxT(t)
	if _, err := c.Engine().OpenRoom(ctx, openReq(1, 100)); err != nil {
		t.Fatalf("OpenRoom: %v", err)
	}
	tests := []struct {
		name     string
		call     func() error
		family   error
		code     codes.Code
		inMsg    string
		retrying bool // the family is retried by retryable RPCs
	}{
		{"unknown room", func() error {
			_, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 404})
			return err
		}, client.ErrNotFound, codes.NotFound, "404", false},
		{"heartbeat of an unregistered rank", func() error {
			_, err := c.Prefill(&pb.RegisterPrefillRequest{BootstrapAddr: "10.9.9.9:1"}).Heartbeat(ctx)
			return err
		}, client.ErrNotFound, codes.NotFound, "register again", false},
		{"duplicate room", func() error {
			_, err := c.Engine().OpenRoom(ctx, openReq(1, 100))
			return err
		}, client.ErrAlreadyExists, codes.AlreadyExists, "room already exists", false},
		{"missing field", func() error {
			req := openReq(2, 100)
			req.PromptLen = 0
			_, err := c.Engine().OpenRoom(ctx, req)
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "prompt_len: must be > 0", false},
		{"request that can never fit", func() error {
			_, err := c.Engine().OpenRoom(ctx, openReq(3, 1<<30))
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "exceeds the maximum number of tokens", false},
		{"page size mismatch", func() error {
			reg := prefillRank("10.0.0.2:8998", 1, 0)
			reg.PageSize = 32
			_, err := c.Prefill(reg).Register(ctx)
			return err
		}, client.ErrFailedPrecondition, codes.FailedPrecondition, "Page size mismatch: prefill server has page_size=32, but decode server has page_size=64", false},
		{"release before success", func() error {
			_, err := c.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: 1})
			return err
		}, client.ErrFailedPrecondition, codes.FailedPrecondition, "has not succeeded", false},
		{"bad send options", func() error {
			_, err := c.Prefill(prefillRank(addr, 1, 0)).SendRoom(ctx, 1, client.SendOptions{ChunkPages: -1})
			return err
		}, client.ErrInvalidArgument, codes.InvalidArgument, "ChunkPages", false},
	}
	families := []error{client.ErrNotFound, client.ErrAlreadyExists, client.ErrInvalidArgument, client.ErrFailedPrecondition,
		client.ErrResourceExhausted, client.ErrUnavailable, client.ErrUnauthenticated, client.ErrAborted,
		client.ErrDeadlineExceeded, client.ErrCanceled, client.ErrInternal, client.ErrRoomFailed}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			var e *client.Error
			if !errors.As(err, &e) {
				t.Fatalf("err = %v (%T), want a *client.Error", err, err)
			}
			for _, f := range families {
				if got, want := errors.Is(err, f), f == tt.family; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, f, got, want)
				}
			}
			if got := status.Code(err); got != tt.code || e.Code() != tt.code {
				t.Errorf("status.Code = %s, (*Error).Code = %s, want %s", got, e.Code(), tt.code)
			}
			if !strings.Contains(e.Message(), tt.inMsg) || !strings.Contains(err.Error(), tt.inMsg) {
				t.Errorf("err = %q, want it to contain %q", err, tt.inMsg)
			}
			if e.RetryAfter() != 0 {
				t.Errorf("RetryAfter = %s, want 0", e.RetryAfter())
			}
		})
	}
}

// TestEveryCodeHasAFamily maps every code the gRPC stack can return.
func TestEveryCodeHasAFamily(t *testing.T) {
	in := newInjector()
	d := newDaemon(t, in.config())
	c := d.client(t, client.WithRetry(client.RetryPolicy{MaxAttempts: 1}))
	tests := []struct {
		code   codes.Code
		family error
	}{
		{codes.Canceled, client.ErrCanceled},
		{codes.Unknown, client.ErrInternal},
		{codes.InvalidArgument, client.ErrInvalidArgument},
		{codes.DeadlineExceeded, client.ErrDeadlineExceeded},
		{codes.NotFound, client.ErrNotFound},
		{codes.AlreadyExists, client.ErrAlreadyExists},
		{codes.PermissionDenied, client.ErrPermissionDenied},
		{codes.ResourceExhausted, client.ErrResourceExhausted},
		{codes.FailedPrecondition, client.ErrFailedPrecondition},
		{codes.Aborted, client.ErrAborted},
		{codes.OutOfRange, client.ErrInvalidArgument},
		{codes.Unimplemented, client.ErrUnimplemented},
		{codes.Internal, client.ErrInternal},
		{codes.Unavailable, client.ErrUnavailable},
		{codes.DataLoss, client.ErrInternal},
		{codes.Unauthenticated, client.ErrUnauthenticated},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			in.fail(pb.Admin_GetStatus_FullMethodName, fault{n: 1, code: tt.code})
			_, err := c.Admin().Status(ctxT(t))
			if !errors.Is(err, tt.family) || status.Code(err) != tt.code {
				t.Errorf("Status() with %s = %v (code %s), want family %v", tt.code, err, status.Code(err), tt.family)
			}
			if got, want := errors.Is(err, context.Canceled), tt.code == codes.Canceled; got != want {
				t.Errorf("errors.Is(err, context.Canceled) = %v, want %v", got, want)
			}
			if got, want := errors.Is(err, context.DeadlineExceeded), tt.code == codes.DeadlineExceeded; got != want {
				t.Errorf("errors.Is(err, context.DeadlineExceeded) = %v, want %v", got, want)
			}
		})
	}
}

func TestAuth(t *testing.T) {
	const token = "tok-5c1e"
	d := newDaemon(t, daemonConfig{server: func(c *server.Config) { c.AuthToken = token }})
	ctx := ctxT(t)
	tests := []struct {
		name string
		opts []client.Option
		want error
	}{
		{"no token", nil, client.ErrUnauthenticated},
		{"wrong token", []client.Option{client.WithToken("tok-wrong")}, client.ErrUnauthenticated},
		{"token", []client.Option{client.WithToken(token)}, nil},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := d.client(t, tt.opts...)
			_, err := c.Engine().OpenRoom(ctx, openReq(uint64(50+i), 100))
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("OpenRoom = %v, want %v", err, tt.want)
			}
			if err != nil && status.Code(err) != codes.Unauthenticated {
				t.Errorf("status.Code = %s, want Unauthenticated", status.Code(err))
			}
			// A refused call stored nothing; reads need no token.
			_, err = c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: uint64(50 + i)})
			if got, want := err == nil, tt.want == nil; got != want {
				t.Errorf("GetRoom after OpenRoom: %v; room stored = %v, want %v", err, got, want)
			}
			// RunHeartbeat stops on an error that repeating cannot fix.
			p := c.Prefill(prefillRank(addr, 1, 0), client.HeartbeatEvery(time.Millisecond))
			hctx, cancel := context.WithCancel(ctx)
			defer cancel()
			if tt.want != nil {
				if err := p.RunHeartbeat(hctx); !errors.Is(err, client.ErrUnauthenticated) {
					t.Errorf("RunHeartbeat = %v, want ErrUnauthenticated", err)
				}
			}
		})
	}
}

func TestContextErrors(t *testing.T) {
	d := newDaemon(t, daemonConfig{})
	c := d.client(t)
	if _, err := c.Engine().OpenRoom(ctxT(t), openReq(61, 100)); err != nil { // waits for a prefill that never comes
		t.Fatalf("OpenRoom: %v", err)
	}
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
		defer cancel()
		room, err := c.Engine().WaitRoom(ctx, 61, pb.RoomPhase_ROOM_PHASE_SUCCEEDED)
		if room != nil || !errors.Is(err, client.ErrDeadlineExceeded) || !errors.Is(err, context.DeadlineExceeded) || status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("WaitRoom = %v, %v; want ErrDeadlineExceeded", room, err)
		}
	})
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancel()
		_, err := c.Admin().GetRoom(ctx, &pb.GetRoomRequest{Room: 61})
		if !errors.Is(err, client.ErrCanceled) || !errors.Is(err, context.Canceled) || status.Code(err) != codes.Canceled {
			t.Errorf("GetRoom = %v, want ErrCanceled", err)
		}
	})
}

// TestIncarnationChangedErrorWithoutRoom: an incarnation change that is
// about no room (a session's or a heartbeat's) does not read "room 0".
func TestIncarnationChangedErrorWithoutRoom(t *testing.T) {
	e := &client.IncarnationChangedError{Old: 0x1f, New: 0x2e}
	if got, want := e.Error(), "decodeplane incarnation 1f (now 2e) is gone: the daemon restarted; register again and claim again"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e.Room = 7
	if got := e.Error(); !strings.HasPrefix(got, "room 7: destination of decodeplane incarnation 1f (now 2e) is void") {
		t.Errorf("Error() with a room = %q", got)
	}
}

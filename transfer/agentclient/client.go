// Package agentclient is the daemon's gRPC client of a transfer agent
// (decodeplane.transfer.v1.TransferAgent): it implements delegate.Agent for
// the delegated transfer engine. The agent's side is transfer/agentservice
// (the reference agent) or any agent speaking the same protocol.
package agentclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/agentwire"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// Options configure Dial.
type Options struct {
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// TracerProvider and Propagator feed the otelgrpc client handler (W3C
	// trace context to the agent); nil means no-op / TraceContext+Baggage.
	TracerProvider trace.TracerProvider
	Propagator     propagation.TextMapPropagator
	// Credentials secure the link (agenttls.NewAgentTLS); nil is plaintext.
	Credentials credentials.TransportCredentials
	// DialOptions are appended.
	DialOptions []grpc.DialOption
}

// maxAgentMessage bounds one message to or from the agent (a large batch of
// copies).
const maxAgentMessage = 64 << 20

// Client implements delegate.Agent over gRPC: SubmitBatch per batch,
// one long-lived WatchCompletions stream (maintained by Run) whose
// completions are matched to waiting batches by batch id. When the stream
// breaks it reconnects at once, replaying the ids it waits for; if the agent
// cannot be reached, or comes back as another instance (a restart: its
// memory is new), the batches in flight fail with delegate.ErrAgentLost.
type Client struct {
	target string
	conn   *grpc.ClientConn
	api    transferv1.TransferAgentClient
	health healthpb.HealthClient
	log    *slog.Logger
	// storm logs what may happen to many batches at once (cancellations
	// the agent did not answer): one line per interval, the first at once.
	storm *stormlog.Logger

	mu        sync.Mutex
	connected bool
	connCh    chan struct{} // closed (and replaced) when the stream connects
	instance  string
	pending   map[string]*pendingBatch
}

type pendingBatch struct {
	room     uint64
	instance string // the instance that accepted it ("" until accepted)
	done     chan error
}

var _ delegate.Agent = (*Client)(nil)

// Dial builds a client for the agent at target; it connects lazily.
// Run must be running for Execute to work. Close releases the connection.
func Dial(target string, opts Options) (*Client, error) {
	opts.Logger, opts.TracerProvider, opts.Propagator = telemetryDefaults(opts.Logger, opts.TracerProvider, opts.Propagator)
	creds := opts.Credentials
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(opts.TracerProvider), otelgrpc.WithPropagators(opts.Propagator))),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(maxAgentMessage), grpc.MaxCallRecvMsgSize(maxAgentMessage)),
	}, opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("transfer agent %s: %w", target, err)
	}
	return &Client{target: target, conn: conn, api: transferv1.NewTransferAgentClient(conn), health: healthpb.NewHealthClient(conn),
		log: opts.Logger, storm: stormlog.New(opts.Logger, stormlog.Options{}), connCh: make(chan struct{}), pending: map[string]*pendingBatch{}}, nil
}

// Close closes the connection.
func (c *Client) Close() error {
	c.storm.Close()
	return c.conn.Close()
}

func unreachable(op string, err error) error {
	return fmt.Errorf("%w: %s: %s", delegate.ErrAgentUnreachable, op, status.Convert(err).Message())
}

// Run keeps the WatchCompletions stream up until ctx is done.
func (c *Client) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	for {
		hello, err := c.watchOnce(ctx)
		c.mu.Lock()
		c.connected = false
		c.mu.Unlock()
		if ctx.Err() != nil {
			c.failPending(func(*pendingBatch) bool { return true }, fmt.Errorf("%w: the daemon is shutting down", delegate.ErrAgentLost))
			return ctx.Err()
		}
		if hello {
			// The stream broke after it was up: reconnect at once; the
			// replay recovers completions sent meanwhile.
			c.log.Warn("transfer agent completion stream broke; reconnecting", "target", c.target, "err", err)
			backoff = 50 * time.Millisecond
			continue
		}
		c.failPending(func(*pendingBatch) bool { return true }, fmt.Errorf("%w: %s: %s", delegate.ErrAgentLost, c.target, status.Convert(err).Message()))
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		backoff = min(2*backoff, time.Second)
	}
}

// watchOnce runs one WatchCompletions stream; hello reports whether it got
// as far as the agent's hello.
func (c *Client) watchOnce(ctx context.Context) (hello bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c.mu.Lock()
	ids := make([]string, 0, len(c.pending))
	for id := range c.pending {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	stream, err := c.api.WatchCompletions(sctx, &transferv1.WatchCompletionsRequest{ReplayBatchIds: ids})
	if err != nil {
		return false, err
	}
	h, err := stream.Recv()
	if err != nil {
		return false, err
	}
	inst := h.GetAgentInstance()
	c.mu.Lock()
	if c.instance != "" && c.instance != inst {
		c.log.Warn("transfer agent restarted", "target", c.target, "old_instance", c.instance, "new_instance", inst)
	}
	c.instance = inst
	c.connected = true
	close(c.connCh)
	c.connCh = make(chan struct{})
	c.mu.Unlock()
	// Batches accepted by another instance will never complete here.
	c.failPending(func(p *pendingBatch) bool { return p.instance != "" && p.instance != inst },
		fmt.Errorf("%w: the transfer agent at %s restarted (instance %s) with the batch in flight", delegate.ErrAgentLost, c.target, inst))
	for {
		comp, err := stream.Recv()
		if err != nil {
			return true, err
		}
		if comp.GetBatchId() == "" {
			continue
		}
		c.mu.Lock()
		p := c.pending[comp.GetBatchId()]
		delete(c.pending, comp.GetBatchId())
		c.mu.Unlock()
		if p == nil {
			continue // not ours, or already given up on
		}
		if comp.GetOk() {
			p.done <- nil
		} else {
			p.done <- errors.New(comp.GetError())
		}
	}
}

func (c *Client) failPending(match func(*pendingBatch) bool, err error) {
	c.mu.Lock()
	var victims []*pendingBatch
	for id, p := range c.pending {
		if match(p) {
			victims = append(victims, p)
			delete(c.pending, id)
		}
	}
	c.mu.Unlock()
	for _, p := range victims {
		p.done <- err
	}
}

// Check implements delegate.Agent: the agent's health is SERVING and the
// completion stream is up (it waits for the stream until ctx is done).
func (c *Client) Check(ctx context.Context) error {
	resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return unreachable("health check", err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%w: health %s", delegate.ErrAgentUnreachable, resp.GetStatus())
	}
	for {
		c.mu.Lock()
		ok, ch := c.connected, c.connCh
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: the completion stream is not connected", delegate.ErrAgentUnreachable)
		}
	}
}

// RegisterBuffers implements delegate.Agent, in calls of at most
// transferv1.MaxBuffers buffers (each all or none; registration is
// idempotent, so a retry after a partial failure is safe).
func (c *Client) RegisterBuffers(ctx context.Context, bufs []kvcopy.BufferSpec) error {
	for len(bufs) > 0 {
		n := min(len(bufs), transferv1.MaxBuffers)
		_, err := c.api.RegisterBuffers(ctx, &transferv1.RegisterBuffersRequest{Buffers: agentwire.BuffersToProto(bufs[:n])})
		switch {
		case err == nil:
		case status.Code(err) == codes.Unavailable:
			return unreachable("register buffers", err)
		default:
			return fmt.Errorf("register buffers: %s", status.Convert(err).Message())
		}
		bufs = bufs[n:]
	}
	return nil
}

// DeregisterBuffers implements delegate.Agent, in calls of at most
// transferv1.MaxBuffers names (each all or none; unknown names are
// ignored, so a retry after a partial failure is safe). The agent refuses
// buffers with copies in flight (FAILED_PRECONDITION): the error carries
// its reason.
func (c *Client) DeregisterBuffers(ctx context.Context, names []string) error {
	for len(names) > 0 {
		n := min(len(names), transferv1.MaxBuffers)
		_, err := c.api.DeregisterBuffers(ctx, &transferv1.DeregisterBuffersRequest{Names: names[:n]})
		switch {
		case err == nil:
		case status.Code(err) == codes.Unavailable:
			return unreachable("deregister buffers", err)
		default:
			return fmt.Errorf("deregister buffers: %s", status.Convert(err).Message())
		}
		names = names[n:]
	}
	return nil
}

// CancelRoom implements delegate.Agent.
func (c *Client) CancelRoom(ctx context.Context, room uint64) error {
	return c.cancel(ctx, room)
}

func (c *Client) cancel(ctx context.Context, room uint64, ids ...string) error {
	_, err := c.api.CancelRoom(ctx, &transferv1.CancelRoomRequest{Room: room, BatchIds: ids})
	switch {
	case err == nil:
		return nil
	case status.Code(err) == codes.Unavailable:
		return unreachable("cancel room", err)
	}
	return fmt.Errorf("cancel room %d: %s", room, status.Convert(err).Message())
}

// submitAttempts is how many times a submission that failed with
// UNAVAILABLE is tried: resubmitting the same batch id is idempotent. Only a
// submission that never started (no completion stream) is "unreachable";
// one that failed on the wire may have been accepted and is "lost".
const submitAttempts = 3

// Execute implements delegate.Agent.
func (c *Client) Execute(ctx context.Context, b kvcopy.Batch) error {
	c.mu.Lock()
	if !c.connected {
		c.mu.Unlock()
		return fmt.Errorf("%w: %s: no completion stream", delegate.ErrAgentUnreachable, c.target)
	}
	p := &pendingBatch{room: b.Room, done: make(chan error, 1)}
	c.pending[b.ID] = p
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, b.ID)
		c.mu.Unlock()
	}
	req := agentwire.BatchToProto(b)
	var resp *transferv1.SubmitBatchResponse
	var err error
	for attempt := range submitAttempts {
		resp, err = c.api.SubmitBatch(ctx, req)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil || attempt == submitAttempts-1 {
			break
		}
		t := time.NewTimer(time.Duration(attempt+1) * 50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if err != nil {
		forget()
		switch {
		case ctx.Err() != nil:
			if cerr := c.cancelQuietly(ctx, b); cerr != nil {
				return unconfirmed(b, c.target, cerr)
			}
			return ctx.Err()
		case status.Code(err) == codes.Unavailable:
			// The request may have reached the agent before the connection
			// broke (its answer lost): the outcome is unknown, so this is not
			// "nothing was written". Cancel it in case the agent is still
			// there (it also fails it at its deadline).
			_ = c.cancelQuietly(ctx, b)
			return fmt.Errorf("%w: submit batch %s to %s: %s (it may have been accepted)", delegate.ErrAgentLost, b.ID, c.target, status.Convert(err).Message())
		}
		return fmt.Errorf("the agent refused batch %s: %s", b.ID, status.Convert(err).Message())
	}
	c.mu.Lock()
	p.instance = resp.GetAgentInstance()
	c.mu.Unlock()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		forget()
		if cerr := c.cancelQuietly(ctx, b); cerr != nil {
			return unconfirmed(b, c.target, cerr)
		}
		return ctx.Err()
	}
}

// cancelWait bounds the wait for a cancellation's confirmation.
const cancelWait = 5 * time.Second

// cancelQuietly cancels one batch at the agent and waits until none of its
// copies is in flight, at most cancelWait. An error: the agent did not
// confirm it within the bound (it did not answer, or refused), so the
// batch may still be writing.
func (c *Client) cancelQuietly(ctx context.Context, b kvcopy.Batch) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelWait)
	defer cancel()
	err := c.cancel(cctx, b.Room, b.ID)
	if err != nil {
		c.storm.Log(ctx, slog.LevelWarn, "could not cancel a batch at the transfer agent", []slog.Attr{slog.String("target", c.target)},
			strconv.FormatUint(b.Room, 10), slog.String("batch", b.ID), slog.Uint64("room", b.Room), slog.Any("err", err))
	}
	return err
}

// unconfirmed is the error of a batch whose cancellation the agent did not
// confirm: its outcome is unknown and it may write until its deadline
// (delegate.ErrAgentLost, which keeps the room's pages out of use until
// then).
func unconfirmed(b kvcopy.Batch, target string, err error) error {
	return fmt.Errorf("%w: batch %s was cancelled, but %s did not confirm it (%v): it may still write until its deadline", delegate.ErrAgentLost, b.ID, target, err)
}

// telemetryDefaults fills in what the caller left nil: the default logger, a
// no-op tracer provider, W3C trace context and baggage.
func telemetryDefaults(l *slog.Logger, tp trace.TracerProvider, p propagation.TextMapPropagator) (*slog.Logger, trace.TracerProvider, propagation.TextMapPropagator) {
	if l == nil {
		l = slog.Default()
	}
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	if p == nil {
		p = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return l, tp, p
}

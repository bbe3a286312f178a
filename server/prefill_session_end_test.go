package server_test

import (
	"context"
	"errors"
	"io"
	"runtime"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestPrefillSessionSlowConsumerAndReconnect: a client that stops reading
// is cut RESOURCE_EXHAUSTED "slow consumer"; its room stays claimed; a new
// session's claim re-delivers the destination once, and the room completes.
func TestPrefillSessionSlowConsumerAndReconnect(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	w := newDrainWire(t, ctx)
	// A fixed window: the transport buffers at most 64 KiB the client
	// does not read.
	conn, err := grpc.NewClient(w.d.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()), w.d.Dialer(),
		grpc.WithInitialWindowSize(1<<16), grpc.WithInitialConnWindowSize(1<<16))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s := openSession(t, ctx, conn)
	s.hello(prank(w.addr, 0), 0)
	w.open(7)
	d := s.claim(7)
	// Pings without reading the pongs, from a goroutine (its Send blocks
	// once the transport's buffers are full), until the daemon cut the
	// session: its handler ended RESOURCE_EXHAUSTED.
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		for i := 0; i < 1<<20; i++ {
			if s.st.Send(pingOp()) != nil {
				return
			}
		}
	}()
	for handled(t, w.d, "Session", "ResourceExhausted") == 0 {
		if ctx.Err() != nil {
			t.Fatal("the session that does not read was not cut")
		}
		runtime.Gosched()
	}
	// Reading now gets the pongs sent before the cut, then the cut.
	wantEnd(t, "the session that did not read", s.streamEnd(), codes.ResourceExhausted, "slow consumer")
	<-flood
	r, err := w.s.room.GetRoom(ctx, &pb.GetRoomRequest{Room: 7})
	if err != nil || r.GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED || len(r.GetCoverage()) != 1 || !r.GetCoverage()[0].GetClaimed() {
		t.Fatalf("after the cut room 7 = %v %v, want it live and claimed", r, err)
	}
	// Reconnect: the claim re-delivers the same destination, once.
	s2 := openSession(t, ctx, w.s.conn)
	s2.hello(prank(w.addr, 0), 0)
	d2 := s2.claim(7)
	if d2.GetAttempt() != d.GetAttempt() || len(d2.GetPageIndices()) != len(d.GetPageIndices()) || d2.GetPageIndices()[0] != d.GetPageIndices()[0] {
		t.Errorf("re-delivered %v, want %v", d2, d)
	}
	seq := s2.op(chunkOp(lastChunk(7, d2)))
	for range 2 {
		ev := s2.recv()
		if ev.GetRoom().GetEvent().GetDestination() != nil {
			t.Error("a second destination on the new session")
		}
		if r := ev.GetResult(); r != nil && (r.GetSeq() != seq || r.GetError() != nil) {
			t.Errorf("chunk = %v", r)
		}
	}
	if p := w.phase(7); p != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Errorf("room 7 is %v, want SUCCEEDED", p)
	}
}

// handled is grpc_server_handled_total of a method and code.
func handled(t *testing.T, d *daemontest.Daemon, method, code string) float64 {
	// Both sessions' method is named Session: the service tells them apart.
	return counter(t, d, "grpc_server_handled_total", map[string]string{"grpc_service": "decodeplane.v1.PrefillSession", "grpc_method": method, "grpc_code": code})
}

// counter is the value of the daemon's counter name with the labels want.
func counter(t *testing.T, d *daemontest.Daemon, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := d.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			match := true
			for k, v := range want {
				match = match && l[k] == v
			}
			if match {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestPrefillSessionTracing: an op's span joins the trace of the
// traceparent its message carries (one trace per request, as with the
// unary API's metadata).
func TestPrefillSessionTracing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	dec := stgDecodeConfig(1)
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}, Daemon: daemon.Options{TracerProvider: tp}})
	conn := d.Conn(t)
	w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
		s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
	w.register("first")
	w.open(7)
	s := openSession(t, ctx, conn)
	s.hello(prank(w.addr, 0), 0)
	dst := s.claim(7)

	caller, span := tp.Tracer("prefill").Start(ctx, "send room 7")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(caller, carrier)
	span.End()
	m := chunkOp(lastChunk(7, dst))
	m.Traceparent = carrier["traceparent"]
	seq := s.op(m)
	for range 2 {
		if r := s.recv().GetResult(); r != nil && (r.GetSeq() != seq || r.GetError() != nil) {
			t.Fatalf("chunk = %v", r)
		}
	}
	want := span.SpanContext().TraceID()
	var found bool
	for _, sp := range spans.GetSpans() {
		if sp.Name == "decodeplane.v1.PrefillSession/Session/chunk" && sp.SpanKind == trace.SpanKindServer && sp.SpanContext.TraceID() == want &&
			sp.Parent.SpanID() == span.SpanContext().SpanID() {
			found = true
		}
	}
	if !found {
		t.Errorf("no chunk span in the caller's trace %s", want)
	}
}

// TestPrefillSessionShutdown: on shutdown every claim of the session gets
// the SHUTDOWN failure (an open room's and a room not yet open), then the
// stream ends OK.
func TestPrefillSessionShutdown(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dec := stgDecodeConfig(1)
	d, err := daemontest.New(daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
		c.Timeouts.HeartbeatInterval = time.Hour
	}})
	if err != nil {
		t.Fatal(err)
	}
	conn := d.Conn(t)
	w := &drainWire{t: t, ctx: ctx, d: d, own: d.Incarnation(), addr: "p1:1",
		s: &stgServer{srv: d.Server(), conn: conn, boot: pb.NewBootstrapClient(conn), room: pb.NewRoomsClient(conn)}}
	w.register("first")
	w.open(7)
	s := openSession(t, ctx, conn)
	s.hello(prank(w.addr, 0), 0)
	s.claim(7)
	seq := s.op(claimOp(99)) // never opened
	if r := s.result(seq); r.GetError() != nil {
		t.Fatalf("claim of room 99 = %v", r)
	}
	stopped := make(chan error, 1)
	go func() {
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		stopped <- d.Shutdown(sctx)
	}()
	ended := map[uint64]bool{}
	for range 2 {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("before the shutdown events: %v", err)
		}
		if f := ev.GetRoom().GetEvent().GetFailure(); f.GetCode() == pb.FailureCode_FAILURE_CODE_SHUTDOWN {
			ended[ev.GetRoom().GetRoom()] = true
		}
	}
	if !ended[7] || !ended[99] {
		t.Errorf("shutdown events for %v, want rooms 7 and 99", ended)
	}
	if err := s.streamEnd(); err != io.EOF {
		t.Errorf("after the shutdown events: %v, want OK", err)
	}
	if err := <-stopped; err != nil && !errors.As(err, new(*daemon.CutShortError)) {
		t.Errorf("shutdown: %v", err)
	}
}

package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	benchv1 "github.com/decodeplane/decodeplane/proto/decodeplane/bench/v1"
)

// The bare-gRPC limit: a separate gRPC server in the bench process serving
// decodeplane.bench.v1.Bench (never registered in the daemon), on loopback
// TCP, with the bench's counting interceptors on the client side, as on the
// daemon's connections. It is measured twice (benchBareVariants): with the
// otelgrpc stats handlers as the run has them — on every client connection
// (client.New always installs one), and on the server only when the daemon
// traces (server.New installs it only with a tracer provider that is not
// the no-op one; with --target, the bench's own tracing stands in) — which
// is the bound the ratio compares with; and with no otelgrpc handler at
// all, to show what the handlers cost. What the daemon adds on top (its
// interceptor chain: Prometheus metrics, logging, panic recovery, auth,
// validation; and the client library's retry and error wrappers) is part of
// the control path the ratio measures.
//
// --api unary measures an empty unary call and server streams of 1 and K
// messages (the unary mix's parts); --api stream measures its own mix
// instead (bench_bare_stream.go).

// benchBareService answers as cheaply as gRPC allows (Session:
// bench_bare_stream.go).
type benchBareService struct {
	benchv1.UnimplementedBenchServer
}

func (benchBareService) Unary(context.Context, *benchv1.Empty) (*benchv1.Empty, error) {
	return &benchv1.Empty{}, nil
}

func (benchBareService) Stream(req *benchv1.StreamRequest, s grpc.ServerStreamingServer[benchv1.Empty]) error {
	m := &benchv1.Empty{}
	for i := uint32(0); req.GetCount() == 0 || i < req.GetCount(); i++ {
		if err := s.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// benchBareResult is one bare-gRPC test.
type benchBareResult struct {
	Name      string        `json:"name"`
	Ops       int64         `json:"ops"`
	Seconds   float64       `json:"seconds"`
	PerSecond float64       `json:"per_second"`
	CPUPerOp  time.Duration `json:"-"`
	// CPUMicrosPerOp and the allocations are per call, stream or message,
	// for the whole process (server and client sides).
	CPUMicrosPerOp float64 `json:"cpu_us_per_op"`
	AllocsPerOp    float64 `json:"allocs_per_op"`
	BytesPerOp     float64 `json:"alloc_bytes_per_op"`
	// Negligible marks a derived cost lost in the measurements' noise.
	Negligible bool `json:"negligible,omitempty"`
	// SentPerOp and ReceivedPerOp (the stream mix) are the session
	// messages the bare rooms sent and received, per room, as counted on
	// the wire in the measured window.
	SentPerOp     float64 `json:"sent_per_op,omitempty"`
	ReceivedPerOp float64 `json:"received_per_op,omitempty"`
}

// benchBare is the bare-gRPC limit on this machine, in one configuration
// of the otelgrpc handlers. --api unary fills Unary to StreamMsg, --api
// stream StreamMix and Mix.
type benchBare struct {
	// Otelgrpc names where the otelgrpc stats handlers were installed:
	// "client", "client+server" or "none".
	Otelgrpc   string          `json:"otelgrpc"`
	Unary      benchBareResult `json:"unary,omitzero"`
	StreamOpen benchBareResult `json:"stream_open,omitzero"`
	StreamK    benchBareResult `json:"stream_open_k,omitzero"`
	// StreamMsg is derived: what each message after a stream's first adds.
	StreamMsg benchBareResult `json:"stream_message,omitzero"`
	// StreamMix is one op per room of the stream mix (Mix) on bare
	// sessions: its rate is the mix's bound.
	StreamMix   benchBareResult `json:"stream_mix,omitzero"`
	Mix         *benchBareMix   `json:"stream_mix_per_room,omitempty"`
	Concurrency int             `json:"concurrency"`
	Conns       int             `json:"connections"`
	Duration    time.Duration   `json:"-"`
	Seconds     float64         `json:"measured_seconds_per_test"`
	Options     string          `json:"options"`
}

// benchBareVariant is one configuration of the bare phase's otelgrpc
// stats handlers.
type benchBareVariant struct {
	serverOtel, clientOtel bool
}

func (v benchBareVariant) String() string {
	switch {
	case v.serverOtel && v.clientOtel:
		return "client+server"
	case v.clientOtel:
		return "client"
	case v.serverOtel:
		return "server"
	}
	return "none"
}

// benchBareVariants are the configurations the bare phase measures: first
// the run's own (the bound the ratio compares with), then none.
func (b *benchRun) benchBareVariants() [2]benchBareVariant {
	// In-process, benchStartDaemon made the daemon's tracer provider the
	// global one; with --target, the bench's own stands in for it.
	tp := otel.GetTracerProvider()
	if !b.tgt.inProcess {
		tp = b.tr.provider
	}
	return [2]benchBareVariant{{serverOtel: benchTracingOn(tp), clientOtel: true}, {}}
}

// benchTracingOn is server.tracingOn: the daemon installs its otelgrpc
// server handler only with a tracer provider that is not the no-op one.
func benchTracingOn(tp trace.TracerProvider) bool {
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return false
	}
	return true
}

// benchBareEnv is a bare server and the fleet's connections to it.
type benchBareEnv struct {
	srv      *grpc.Server
	served   chan error
	conns    []*grpc.ClientConn
	clients  []benchv1.BenchClient
	counters benchCounters
}

// bareStart serves decodeplane.bench.v1.Bench on loopback TCP and opens as
// many connections as the fleet has (the decode engine's and one per
// prefill rank).
func (b *benchRun) bareStart(v benchBareVariant) (*benchBareEnv, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	serverTP := otel.GetTracerProvider()
	if !b.tgt.inProcess {
		serverTP = b.tr.provider
	}
	var sopts []grpc.ServerOption
	if v.serverOtel {
		sopts = append(sopts, grpc.StatsHandler(otelgrpc.NewServerHandler(
			otelgrpc.WithTracerProvider(serverTP), otelgrpc.WithPropagators(b.tr.propagator))))
	}
	e := &benchBareEnv{srv: grpc.NewServer(sopts...), served: make(chan error, 1)}
	benchv1.RegisterBenchServer(e.srv, benchBareService{})
	go func() { e.served <- e.srv.Serve(lis) }()
	for range 1 + b.ranks {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if v.clientOtel {
			opts = append(opts, grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(b.tr.provider), otelgrpc.WithPropagators(b.tr.propagator))))
		}
		conn, err := grpc.NewClient(lis.Addr().String(), append(opts, e.counters.dialOptions(nil)...)...)
		if err != nil {
			e.stop()
			return nil, err
		}
		e.conns = append(e.conns, conn)
		e.clients = append(e.clients, benchv1.NewBenchClient(conn))
	}
	return e, nil
}

func (e *benchBareEnv) stop() {
	for _, c := range e.conns {
		c.Close()
	}
	e.srv.Stop()
	<-e.served
}

// bare measures the bare-gRPC limit at the run's concurrency in each
// configuration of benchBareVariants: the unary mix's parts with --api
// unary, the stream mix measured in lc (benchStreamMixOf) with --api
// stream. Both configurations' servers are up together and each test runs
// in one right after the other, so that a busy machine's drift falls
// between tests rather than between the two bounds. skipped is set (and
// both results nil) when the stream mix cannot be modelled.
func (b *benchRun) bare(ctx context.Context, prog *benchProgress, lc *benchPhase) (asRun, noOtel *benchBare, skipped string, err error) {
	var mix *benchBareMix
	if b.o.stream() {
		if mix, skipped = benchStreamMixOf(lc, b.groups); mix == nil {
			return nil, nil, skipped, nil
		}
	}
	var (
		envs [2]*benchBareEnv
		out  [2]*benchBare
	)
	defer func() {
		for _, e := range envs {
			if e != nil {
				e.stop()
			}
		}
	}()
	for i, v := range b.benchBareVariants() {
		if envs[i], err = b.bareStart(v); err != nil {
			return nil, nil, "", err
		}
		out[i] = &benchBare{Otelgrpc: v.String(), Concurrency: b.o.concurrency, Conns: len(envs[i].conns), Duration: b.o.bareDuration,
			Seconds: b.o.bareDuration.Seconds(), Options: "loopback TCP, insecure, otelgrpc stats handler on " + v.String() + ", counting client interceptors"}
	}
	if mix != nil {
		for i := range envs {
			if err := b.bareStreamMix(ctx, prog, envs[i], mix, out[i], benchBareSuffix(i)); err != nil {
				return nil, nil, "", err
			}
		}
	} else if err := b.bareUnary(ctx, prog, envs, out); err != nil {
		return nil, nil, "", err
	}
	return out[0], out[1], "", nil
}

// benchBareSuffix labels the progress of variant i.
func benchBareSuffix(i int) string {
	if i == 1 {
		return ", no otelgrpc"
	}
	return ""
}

// bareUnary measures the unary mix's parts in each variant: an empty unary
// call, and server streams of 1 and benchBareStreamK messages.
func (b *benchRun) bareUnary(ctx context.Context, prog *benchProgress, envs [2]*benchBareEnv, res [2]*benchBare) error {
	openK := func(k uint32) func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error {
		return func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error {
			for {
				s, err := c.Stream(ctx, &benchv1.StreamRequest{Count: k})
				if err != nil {
					return err
				}
				for range k {
					if _, err := s.Recv(); err != nil {
						return err
					}
				}
				if _, err := s.Recv(); !errors.Is(err, io.EOF) {
					if err == nil {
						err = fmt.Errorf("the stream sent more than the %d messages asked for", k)
					}
					return err
				}
				n.Add(1)
			}
		}
	}
	tests := []struct {
		name, label string
		out         func(*benchBare) *benchBareResult
		worker      func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error
	}{
		{"unary call", "bare unary", func(r *benchBare) *benchBareResult { return &r.Unary }, func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error {
			for {
				if _, err := c.Unary(ctx, &benchv1.Empty{}); err != nil {
					return err
				}
				n.Add(1)
			}
		}},
		{"stream open + 1 message", "bare stream, 1 message", func(r *benchBare) *benchBareResult { return &r.StreamOpen }, openK(1)},
		{fmt.Sprintf("stream open + %d messages", benchBareStreamK), fmt.Sprintf("bare stream, %d messages", benchBareStreamK),
			func(r *benchBare) *benchBareResult { return &r.StreamK }, openK(benchBareStreamK)},
	}
	for _, t := range tests {
		for v, e := range envs {
			prog.setPhase(t.label+benchBareSuffix(v), 0)
			clients := e.clients
			r, _, err := benchMeasure(ctx, &e.counters, b.o.concurrency, b.o.bareDuration, func(ctx context.Context, i int, n *atomic.Int64) error {
				return t.worker(ctx, clients[i%len(clients)], n)
			})
			if err != nil {
				return fmt.Errorf("%s (otelgrpc on %s): %w", t.name, res[v].Otelgrpc, err)
			}
			r.Name = t.name
			*t.out(res[v]) = r
		}
	}
	for _, r := range res {
		r.StreamMsg = benchDeriveMessage(r.StreamOpen, r.StreamK, benchBareStreamK)
	}
	return nil
}

// benchBareStreamK is the length of the longer bare streams: the cost of a
// stream message is what K messages add to a stream over one message.
// Streams that send without end are no reference: with hundreds of them on a
// connection, gRPC-Go's flow control makes each message cost more than a
// unary call, a pathology the daemon's streams (a few messages each, spaced
// by the room's progress) never meet.
const benchBareStreamK = 8

// benchDeriveMessage derives the cost of one more stream message from
// streams of 1 and k messages (each op there is a whole stream): capacity
// seconds per message = (1/rate_k − 1/rate_1) / (k − 1), likewise CPU and
// allocations. A difference lost in noise (≤ 0) is reported as negligible,
// and the bound then charges nothing for messages.
func benchDeriveMessage(one, k benchBareResult, n int) benchBareResult {
	r := benchBareResult{Name: "stream message (derived)"}
	if one.PerSecond <= 0 || k.PerSecond <= 0 || n < 2 {
		return r
	}
	per := (1/k.PerSecond - 1/one.PerSecond) / float64(n-1)
	if per > 0 {
		r.PerSecond = 1 / per
	} else {
		r.Negligible = true
	}
	r.CPUMicrosPerOp = math.Max(0, (k.CPUMicrosPerOp-one.CPUMicrosPerOp)/float64(n-1))
	r.AllocsPerOp = math.Max(0, (k.AllocsPerOp-one.AllocsPerOp)/float64(n-1))
	r.BytesPerOp = math.Max(0, (k.BytesPerOp-one.BytesPerOp)/float64(n-1))
	r.CPUPerOp = time.Duration(r.CPUMicrosPerOp * 1e3)
	return r
}

// benchMeasure runs conc workers (worker i of conc) for a warm-up, then
// measures the operations they complete in dur; counts are what the
// counters saw in that window.
func benchMeasure(ctx context.Context, counters *benchCounters, conc int, dur time.Duration,
	worker func(ctx context.Context, i int, n *atomic.Int64) error) (r benchBareResult, counts benchCounts, err error) {
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	var (
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for i := range conc {
		wg.Go(func() {
			if err := worker(mctx, i, &n); err != nil && mctx.Err() == nil {
				errOnce.Do(func() { firstErr = err; cancel() })
			}
		})
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-mctx.Done():
			return false
		}
	}
	warm := min(dur/4, 500*time.Millisecond)
	if wait(warm) {
		c0, u0, n0, t0 := counters.snapshot(), benchReadUsage(), n.Load(), time.Now()
		if wait(dur) {
			u1, n1, t1, c1 := benchReadUsage(), n.Load(), time.Now(), counters.snapshot()
			u := u1.sub(u0)
			counts = c1.sub(c0)
			r.Ops, r.Seconds = n1-n0, t1.Sub(t0).Seconds()
			if r.Ops > 0 {
				r.PerSecond = float64(r.Ops) / r.Seconds
				r.CPUPerOp = u.cpu / time.Duration(r.Ops)
				r.CPUMicrosPerOp = float64(u.cpu) / 1e3 / float64(r.Ops)
				r.AllocsPerOp = float64(u.allocObjects) / float64(r.Ops)
				r.BytesPerOp = float64(u.allocBytes) / float64(r.Ops)
			}
		}
	}
	cancel()
	wg.Wait()
	switch {
	case firstErr != nil:
		return r, counts, firstErr
	case ctx.Err() != nil:
		return r, counts, errors.New("interrupted")
	case r.Ops == 0:
		return r, counts, errors.New("no operation completed")
	}
	return r, counts, nil
}

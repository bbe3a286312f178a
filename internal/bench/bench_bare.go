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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	benchv1 "github.com/decodeplane/decodeplane/proto/decodeplane/bench/v1"
)

// The bare-gRPC limit: a separate gRPC server in the bench process serving
// decodeplane.bench.v1.Bench (never registered in the daemon), on loopback
// TCP, with the transport options the daemon's server and the client library
// use: the otelgrpc stats handler on the server (the daemon's tracer
// provider and W3C propagators) and on every client connection (the bench's),
// plus the bench's counting interceptors on the client side, as on the
// daemon's connections. What the daemon adds on top (its interceptor chain:
// Prometheus metrics, logging, panic recovery, auth, validation; and the
// client library's retry and error wrappers) is part of the control path the
// ratio measures.

// benchBareService answers as cheaply as gRPC allows.
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
}

// benchBare is the bare-gRPC limit on this machine.
type benchBare struct {
	Unary      benchBareResult `json:"unary"`
	StreamOpen benchBareResult `json:"stream_open"`
	StreamK    benchBareResult `json:"stream_open_k"`
	// StreamMsg is derived: what each message after a stream's first adds.
	StreamMsg   benchBareResult `json:"stream_message"`
	Concurrency int             `json:"concurrency"`
	Conns       int             `json:"connections"`
	Duration    time.Duration   `json:"-"`
	Seconds     float64         `json:"measured_seconds_per_test"`
	Options     string          `json:"options"`
}

// bare measures the bare-gRPC limit at the run's concurrency, over as many
// connections as the fleet has (the decode engine's and one per prefill
// rank), each test warmed up and then measured for --bare-duration.
func (b *benchRun) bare(ctx context.Context, prog *benchProgress) (*benchBare, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	// In-process, benchStartDaemon made the daemon's tracer provider the global
	// one; with --target, the bench's own stands in for it.
	serverTP := otel.GetTracerProvider()
	if !b.tgt.inProcess {
		serverTP = b.tr.provider
	}
	srv := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(serverTP), otelgrpc.WithPropagators(b.tr.propagator))))
	benchv1.RegisterBenchServer(srv, benchBareService{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	defer func() {
		srv.Stop()
		<-served
	}()

	nconn := 1 + b.ranks
	var counters benchCounters
	clients := make([]benchv1.BenchClient, 0, nconn)
	for range nconn {
		opts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(b.tr.provider), otelgrpc.WithPropagators(b.tr.propagator))),
		}, counters.dialOptions(nil)...)
		conn, err := grpc.NewClient(lis.Addr().String(), opts...)
		if err != nil {
			return nil, err
		}
		defer conn.Close()
		clients = append(clients, benchv1.NewBenchClient(conn))
	}
	res := &benchBare{Concurrency: b.o.concurrency, Conns: nconn, Duration: b.o.bareDuration, Seconds: b.o.bareDuration.Seconds(),
		Options: "loopback TCP, insecure, otelgrpc stats handler on server and client, counting client interceptors"}

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
		out         *benchBareResult
		worker      func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error
	}{
		{"unary call", "bare unary", &res.Unary, func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error {
			for {
				if _, err := c.Unary(ctx, &benchv1.Empty{}); err != nil {
					return err
				}
				n.Add(1)
			}
		}},
		{"stream open + 1 message", "bare stream, 1 message", &res.StreamOpen, openK(1)},
		{fmt.Sprintf("stream open + %d messages", benchBareStreamK), fmt.Sprintf("bare stream, %d messages", benchBareStreamK), &res.StreamK, openK(benchBareStreamK)},
	}
	for _, t := range tests {
		prog.setPhase(t.label, 0)
		r, err := benchMeasure(ctx, clients, b.o.concurrency, b.o.bareDuration, t.worker)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.name, err)
		}
		r.Name = t.name
		*t.out = r
	}
	res.StreamMsg = benchDeriveMessage(res.StreamOpen, res.StreamK, benchBareStreamK)
	return res, nil
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

// benchMeasure runs conc workers (spread over the clients) for a warm-up,
// then measures the operations they complete in dur.
func benchMeasure(ctx context.Context, clients []benchv1.BenchClient, conc int, dur time.Duration,
	worker func(ctx context.Context, c benchv1.BenchClient, n *atomic.Int64) error) (benchBareResult, error) {
	mctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	var (
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for i := range conc {
		c := clients[i%len(clients)]
		wg.Go(func() {
			if err := worker(mctx, c, &n); err != nil && mctx.Err() == nil {
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
	var r benchBareResult
	if wait(warm) {
		u0, n0, t0 := benchReadUsage(), n.Load(), time.Now()
		if wait(dur) {
			u1, n1, t1 := benchReadUsage(), n.Load(), time.Now()
			u := u1.sub(u0)
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
		return r, firstErr
	case ctx.Err() != nil:
		return r, errors.New("interrupted")
	case r.Ops == 0:
		return r, errors.New("no operation completed")
	}
	return r, nil
}

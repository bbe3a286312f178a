package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/client"
)

// The bench's watchdog: a bench pointed at a daemon that stopped (make demo
// after make run ended) must not go on failing rooms forever. The watchdog
// asks the daemon's standard health service on a connection of its own (not
// counted, not traced) every probe interval; once no answer came for
// --unreachable-timeout, the bench stops starting rooms, gives up the rooms
// in flight, prints the summary and exits 1 saying why. Any answer counts as
// reachable (NOT_SERVING while draining, even Unimplemented): only
// Unavailable and a probe without an answer within its interval do not.

// defaultUnreachableTimeout is --unreachable-timeout's default: long enough
// for a daemon restart or a network blip of a few seconds, short enough that
// an operator sees the demo stop soon after the daemon did.
const defaultUnreachableTimeout = 5 * time.Second

// errBenchUnreachable marks the rooms given up because the daemon could not
// be reached (their failure reason in the summary).
var errBenchUnreachable = errors.New("the daemon is unreachable")

// benchUnreachableError is why the watchdog stopped the run.
type benchUnreachableError struct {
	addr    string
	silent  time.Duration // since the last answer
	timeout time.Duration
	last    error // the last probe's error
}

func (e *benchUnreachableError) Error() string {
	last := e.last.Error()
	if st, ok := status.FromError(e.last); ok {
		last = st.Code().String() + ": " + st.Message()
	}
	return fmt.Sprintf("the daemon at %s has not answered for %s (--unreachable-timeout %s; last error: %s): stopped; is it still running? the figures cover the rooms that finished",
		e.addr, e.silent.Round(time.Millisecond), e.timeout, last)
}

func (e *benchUnreachableError) Unwrap() error { return errBenchUnreachable }

// benchWatchdog decides when the daemon has been unreachable too long.
type benchWatchdog struct {
	addr     string
	timeout  time.Duration
	interval time.Duration
	// probe returns nil when the daemon answered, the error otherwise; its
	// context ends when the daemon would have been silent for timeout (a
	// slow answer is an answer), or after interval if that is later.
	probe func(ctx context.Context) error
}

// benchProbeInterval is how often the watchdog probes for a timeout: four
// probes per timeout, at least one a second.
func benchProbeInterval(timeout time.Duration) time.Duration {
	return min(time.Second, max(timeout/4, 10*time.Millisecond))
}

// run probes every interval until ctx ends (nil) or until no probe was
// answered for timeout since the last answer (or since run started: the
// daemon has just answered the bench's setup).
func (w *benchWatchdog) run(ctx context.Context) error {
	last := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for {
		pctx, cancel := context.WithDeadline(ctx, later(last.Add(w.timeout), time.Now().Add(w.interval)))
		err := w.probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		wait := w.interval
		if err == nil {
			last = now
		} else if silent := now.Sub(last); silent >= w.timeout {
			return &benchUnreachableError{addr: w.addr, silent: silent, timeout: w.timeout, last: err}
		} else {
			// The next probe no later than when the timeout is reached.
			wait = min(wait, w.timeout-silent)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
	}
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// benchHealthProbe asks c's daemon for its health: nil when it answered.
func benchHealthProbe(c *client.Client) func(context.Context) error {
	hc := healthpb.NewHealthClient(c.Conn())
	return func(ctx context.Context) error {
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded:
			return err
		}
		return nil
	}
}

// benchWatch is a running watchdog.
type benchWatch struct {
	cancel context.CancelFunc
	done   chan struct{}
	c      *client.Client
	once   sync.Once
	err    error
}

// startBenchWatch watches the daemon at addr; when it is unreachable for
// timeout, giveUp is called with the reason.
func startBenchWatch(addr string, timeout time.Duration, giveUp func(error)) (*benchWatch, error) {
	c, err := client.New(addr, client.WithTracerProvider(noop.NewTracerProvider()))
	if err != nil {
		return nil, err
	}
	w := &benchWatchdog{addr: addr, timeout: timeout, interval: benchProbeInterval(timeout), probe: benchHealthProbe(c)}
	ctx, cancel := context.WithCancel(context.Background())
	bw := &benchWatch{cancel: cancel, done: make(chan struct{}), c: c}
	go func() {
		defer close(bw.done)
		if err := w.run(ctx); err != nil {
			bw.err = err
			giveUp(err)
		}
	}()
	return bw, nil
}

// stop ends the watch and returns why it stopped the run, if it did.
func (bw *benchWatch) stop() error {
	if bw == nil {
		return nil
	}
	bw.once.Do(func() {
		bw.cancel()
		<-bw.done
		bw.c.Close()
	})
	return bw.err
}

package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBenchWatchdog: when the watchdog gives up, on the clock.
func TestBenchWatchdog(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "connection refused")
	for _, tt := range []struct {
		name string
		// probe answers (nil) or not, at time since the start.
		probe func(ctx context.Context, since time.Duration) error
		// giveUp is when the watchdog gives up (0: never, in the 60s run).
		giveUp  time.Duration
		lastErr string
	}{
		{"refused from the start", func(context.Context, time.Duration) error { return unavailable }, 5 * time.Second, "Unavailable: connection refused"},
		{"no answer at all (a black hole)", func(ctx context.Context, _ time.Duration) error {
			<-ctx.Done()
			return status.FromContextError(ctx.Err()).Err()
		}, 5 * time.Second, "DeadlineExceeded: context deadline exceeded"},
		{"up for 10s, then refused", func(_ context.Context, since time.Duration) error {
			if since < 10*time.Second {
				return nil
			}
			return unavailable
		}, 14 * time.Second, "Unavailable: connection refused"}, // the last answer was the probe at 9s
		{"a 4s outage is survived", func(_ context.Context, since time.Duration) error {
			if since >= 10*time.Second && since < 14*time.Second {
				return unavailable
			}
			return nil
		}, 0, ""},
		{"refused after an answer that took 1ms", func(_ context.Context, since time.Duration) error {
			// The last answer at 1ms: the watchdog gives up when 5s have
			// passed since, not at the next whole second of its start.
			if since == 0 {
				time.Sleep(time.Millisecond)
				return nil
			}
			return unavailable
		}, 5*time.Second + time.Millisecond, "Unavailable: connection refused"},
		{"slow answers are answers", func(ctx context.Context, _ time.Duration) error {
			select {
			case <-time.After(3 * time.Second):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}, 0, ""},
		{"an answer other than SERVING is an answer", func(context.Context, time.Duration) error { return nil }, 0, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				w := &benchWatchdog{addr: "127.0.0.1:7600", timeout: 5 * time.Second, interval: benchProbeInterval(5 * time.Second),
					probe: func(ctx context.Context) error { return tt.probe(ctx, time.Since(start)) }}
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				defer cancel()
				err := w.run(ctx)
				took := time.Since(start)
				if tt.giveUp == 0 {
					if err != nil || took != 60*time.Second {
						t.Errorf("gave up after %s: %v; want to watch until the end (60s)", took, err)
					}
					return
				}
				var ue *benchUnreachableError
				if !errors.As(err, &ue) || !errors.Is(err, errBenchUnreachable) || took != tt.giveUp {
					t.Fatalf("run = %v after %s, want an unreachable error after %s", err, took, tt.giveUp)
				}
				if ue.silent != 5*time.Second || !strings.HasPrefix(err.Error(), "the daemon at 127.0.0.1:7600 has not answered for 5s (--unreachable-timeout 5s; last error: "+tt.lastErr+"): stopped; ") {
					t.Errorf("error %q (silent %s)", err, ue.silent)
				}
			})
		})
	}
	if got := benchProbeInterval(5 * time.Second); got != time.Second {
		t.Errorf("probe interval for 5s = %s, want 1s", got)
	}
	if got := benchProbeInterval(time.Second); got != 250*time.Millisecond {
		t.Errorf("probe interval for 1s = %s, want 250ms", got)
	}
}

package kvlayout

import (
	"context"
	"sync"
	"time"
)

// Clock is a source of time. RealClock is the default; tests run it inside
// testing/synctest bubbles, where time is virtual.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d; Stop cancels it.
	AfterFunc(d time.Duration, f func()) Stopper
}

// Stopper stops a pending AfterFunc.
type Stopper interface{ Stop() bool }

// RealClock reads the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (RealClock) AfterFunc(d time.Duration, f func()) Stopper { return time.AfterFunc(d, f) }

// Sleep waits d on the clock or until ctx is done (then it returns ctx's
// error); d <= 0 returns ctx.Err() at once.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	done := make(chan struct{})
	t := c.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		t.Stop()
		return ctx.Err()
	}
}

// Ticker is a clock-driven ticker (time.Ticker on the injected clock): C
// receives a value every d; a tick that finds one pending is dropped.
type Ticker struct {
	C    <-chan struct{}
	c    chan struct{}
	mu   sync.Mutex
	t    Stopper
	done bool
}

// NewTicker starts a ticker on c with period d.
func NewTicker(c Clock, d time.Duration) *Ticker {
	t := &Ticker{c: make(chan struct{}, 1)}
	t.C = t.c
	var arm func()
	arm = func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if t.done {
			return
		}
		t.t = c.AfterFunc(d, func() {
			select {
			case t.c <- struct{}{}:
			default: // a tick is already pending
			}
			arm()
		})
	}
	arm()
	return t
}

// Stop stops the ticker: no tick is armed after it returns (a tick already
// firing may still be delivered).
func (t *Ticker) Stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	if t.t != nil {
		t.t.Stop()
	}
}

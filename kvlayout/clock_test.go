package kvlayout_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/decodeplane/decodeplane/kvlayout"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var c kvlayout.Clock = kvlayout.RealClock{}
		start := time.Now()
		if err := kvlayout.Sleep(context.Background(), c, 3*time.Second); err != nil {
			t.Fatalf("Sleep = %v", err)
		}
		if el := time.Since(start); el != 3*time.Second {
			t.Errorf("Sleep(3s) took %s", el)
		}
		// A done context ends the wait at once, with its error.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start = time.Now()
		if err := kvlayout.Sleep(ctx, c, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Sleep(1h) under a 1s deadline = %v, want DeadlineExceeded", err)
		}
		if el := time.Since(start); el != time.Second {
			t.Errorf("cancelled Sleep took %s, want 1s", el)
		}
		// d <= 0 does not wait, and reports the context.
		if err := kvlayout.Sleep(ctx, c, 0); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Sleep(0) on a done context = %v", err)
		}
		if err := kvlayout.Sleep(context.Background(), c, -time.Second); err != nil {
			t.Errorf("Sleep(-1s) = %v", err)
		}
	})
}

func TestTicker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		tk := kvlayout.NewTicker(kvlayout.RealClock{}, time.Second)
		for i := 1; i <= 3; i++ {
			<-tk.C
			if el := time.Since(start); el != time.Duration(i)*time.Second {
				t.Errorf("tick %d at %s, want %ds", i, el, i)
			}
		}
		// Ticks nobody reads coalesce into one pending tick.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		<-tk.C
		select {
		case <-tk.C:
			t.Error("a second pending tick after 5 unread periods; want one")
		default:
		}
		// After Stop no tick is armed: nothing arrives however long we wait.
		tk.Stop()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		select {
		case <-tk.C:
			t.Error("tick after Stop")
		default:
		}
	})
}

package stormlog

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// line is one record as the test sees it: its level, message and
// attributes rendered key=value (groups flattened with dots).
type line struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs map[string]string
}

// recorder is an slog.Handler that keeps every record.
type recorder struct {
	mu    sync.Mutex
	lines []line
	min   slog.Level
}

func (r *recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.min }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	l := line{at: time.Now(), level: rec.Level, msg: rec.Message, attrs: map[string]string{}}
	var add func(prefix string, a slog.Attr)
	add = func(prefix string, a slog.Attr) {
		if a.Value.Kind() == slog.KindGroup {
			for _, g := range a.Value.Group() {
				add(prefix+a.Key+".", g)
			}
			return
		}
		l.attrs[prefix+a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool { add("", a); return true })
	r.mu.Lock()
	r.lines = append(r.lines, l)
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler      { return r }

func (r *recorder) take() []line {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.lines
	r.lines = nil
	return out
}

// sleep advances the bubble's clock by d and lets the timers that fired
// finish.
func sleep(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

func newLogger(o Options) (*Logger, *recorder) {
	rec := &recorder{min: slog.LevelInfo}
	return New(slog.New(rec), o), rec
}

var failedAt = []slog.Attr{slog.String("code", "prefill_lost"), slog.String("bootstrap_addr", "10.0.0.1:8998")}

// failRoom is one room failure of the cause failedAt.
func failRoom(l *Logger, room int) {
	id := strconv.Itoa(room)
	l.Log(context.Background(), slog.LevelWarn, "room failed", failedAt, id, slog.String("room", id), slog.String("reason", "lost "+id))
}

// A lone event is logged at once, with its cause and detail, as a plain
// slog call would log it.
func TestLoneEventLoggedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{})
		failRoom(l, 7)
		got := rec.take()
		if len(got) != 1 {
			t.Fatalf("%d lines, want 1: %+v", len(got), got)
		}
		want := map[string]string{"code": "prefill_lost", "bootstrap_addr": "10.0.0.1:8998", "room": "7", "reason": "lost 7"}
		if got[0].msg != "room failed" || got[0].level != slog.LevelWarn || fmt.Sprint(got[0].attrs) != fmt.Sprint(want) {
			t.Errorf("line %+v, want room failed at WARN with %v", got[0], want)
		}
		sleep(time.Hour)
		if got := rec.take(); len(got) != 0 {
			t.Errorf("a lone event wrote a summary: %+v", got)
		}
	})
}

// A storm of one cause writes two lines whatever its size: the first event
// at once, and when the interval ends one summary with the count, the ids
// of the first few and the detail of the first counted.
func TestStormOfOneCauseIsTwoLines(t *testing.T) {
	for _, n := range []int{2, 1000, 100_000} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, rec := newLogger(Options{Interval: 10 * time.Second, Samples: 3})
				start := time.Now()
				for i := range n {
					failRoom(l, i+1)
				}
				if got := rec.take(); len(got) != 1 || got[0].attrs["room"] != "1" {
					t.Fatalf("during the storm: %+v, want the first room's line alone", got)
				}
				sleep(10*time.Second - time.Nanosecond)
				if got := rec.take(); len(got) != 0 {
					t.Fatalf("a summary before the interval ended: %+v", got)
				}
				sleep(time.Nanosecond)
				got := rec.take()
				if len(got) != 1 {
					t.Fatalf("at the interval's end: %d lines, want 1: %+v", len(got), got)
				}
				s := got[0]
				ids := "2 3 4"
				if n == 2 {
					ids = "2"
				}
				want := map[string]string{"code": "prefill_lost", "bootstrap_addr": "10.0.0.1:8998", "count": strconv.Itoa(n - 1),
					"ids": ids, "first.room": "2", "first.reason": "lost 2", "over": "10s"}
				if s.msg != "room failed" || s.level != slog.LevelWarn || fmt.Sprint(s.attrs) != fmt.Sprint(want) || !s.at.Equal(start.Add(10*time.Second)) {
					t.Errorf("summary %+v, want room failed at WARN at +10s with %v", s, want)
				}
				sleep(time.Hour)
				if got := rec.take(); len(got) != 0 {
					t.Errorf("lines after the storm: %+v", got)
				}
			})
		})
	}
}

// A steady stream of one cause writes one line per interval, each counting
// what came since the previous one.
func TestSteadyStreamOneLinePerInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{Interval: time.Second})
		const perSecond, seconds = 100, 30
		for i := range perSecond * seconds {
			failRoom(l, i+1)
			sleep(time.Second / perSecond)
		}
		l.Flush()
		got := rec.take()
		if len(got) > seconds+1 {
			t.Fatalf("%d lines for %d seconds of events, want at most %d", len(got), seconds, seconds+1)
		}
		total := 0
		for i, g := range got {
			if i == 0 {
				total++
				continue
			}
			n, err := strconv.Atoi(g.attrs["count"])
			if err != nil {
				t.Fatalf("line %d has no count: %+v", i, g)
			}
			total += n
			if i > 1 && g.at.Sub(got[i-1].at) < time.Second {
				t.Errorf("lines %d and %d %s apart, want at least the interval", i-1, i, g.at.Sub(got[i-1].at))
			}
		}
		if total != perSecond*seconds {
			t.Errorf("the lines count %d events, want %d", total, perSecond*seconds)
		}
	})
}

// Causes are counted apart: each has its own first line and summary.
func TestCausesApart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{})
		for i := range 10 {
			failRoom(l, i)
			l.Log(context.Background(), slog.LevelWarn, "room failed", []slog.Attr{slog.String("code", "aborted")}, strconv.Itoa(i))
			l.Log(context.Background(), slog.LevelInfo, "room draining", nil, strconv.Itoa(i))
		}
		if got := rec.take(); len(got) != 3 {
			t.Fatalf("%d first lines, want 3 (one per cause): %+v", len(got), got)
		}
		sleep(DefaultInterval)
		got := rec.take()
		if len(got) != 3 {
			t.Fatalf("%d summaries, want 3: %+v", len(got), got)
		}
		for _, g := range got {
			if g.attrs["count"] != "9" {
				t.Errorf("summary %+v, want count 9", g)
			}
		}
	})
}

// A cause quiet for an interval logs its next event at once again.
func TestQuietCauseLogsAtOnceAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{Interval: time.Second})
		failRoom(l, 1)
		sleep(time.Second)
		failRoom(l, 2)
		got := rec.take()
		if len(got) != 2 || got[1].attrs["room"] != "2" {
			t.Fatalf("%+v, want both rooms' own lines", got)
		}
	})
}

// Below the handler's level nothing is recorded, counted or written.
func TestDisabledLevelRecordsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{})
		for i := range 100 {
			l.Log(context.Background(), slog.LevelDebug, "batch done", nil, strconv.Itoa(i))
		}
		l.Flush()
		if got := rec.take(); len(got) != 0 {
			t.Errorf("debug events wrote %+v", got)
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.causes) != 0 {
			t.Errorf("%d causes followed for disabled events", len(l.causes))
		}
	})
}

// Beyond MaxCauses new causes are counted under their message alone, so
// that neither the memory nor the lines grow with the causes.
func TestCausesBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{MaxCauses: 4})
		for i := range 1000 {
			l.Log(context.Background(), slog.LevelWarn, "room failed", []slog.Attr{slog.Int("addr", i)}, strconv.Itoa(i))
		}
		first := rec.take()
		if len(first) != 5 { // four causes, then the overflow's first
			t.Fatalf("%d lines, want 5: %+v", len(first), first)
		}
		if first[4].attrs["other_causes"] != "true" || first[4].attrs["addr"] != "4" {
			t.Errorf("the fifth cause's line %+v, want its own cause and other_causes=true", first[4])
		}
		sleep(DefaultInterval)
		got := rec.take()
		if len(got) != 1 || got[0].attrs["count"] != "995" || got[0].attrs["ids"] != "5 6 7 8 9" {
			t.Fatalf("summaries %+v, want one of the other causes counting 995", got)
		}
		// Idle causes are forgotten to make room for new ones.
		sleep(DefaultInterval)
		l.Log(context.Background(), slog.LevelWarn, "room failed", []slog.Attr{slog.Int("addr", 5000)}, "5000")
		if got := rec.take(); len(got) != 1 || got[0].attrs["addr"] != "5000" {
			t.Errorf("a new cause after the others went idle: %+v, want its own line", got)
		}
	})
}

// Flush writes what is pending at once; Close flushes, and what comes
// after it is written one line each.
func TestFlushAndClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{})
		for i := range 50 {
			failRoom(l, i)
		}
		l.Flush()
		got := rec.take()
		if len(got) != 2 || got[1].attrs["count"] != "49" || got[1].attrs["over"] != "0s" {
			t.Fatalf("after Flush: %+v, want the first line and a summary of 49", got)
		}
		failRoom(l, 100)
		l.Close()
		if got := rec.take(); len(got) != 1 || got[0].attrs["count"] != "1" {
			t.Fatalf("after Close: %+v, want the pending event's summary", got)
		}
		failRoom(l, 101)
		failRoom(l, 102)
		if got := rec.take(); len(got) != 2 || got[1].attrs["room"] != "102" {
			t.Fatalf("after Close: %+v, want each event's own line", got)
		}
		sleep(time.Hour)
		if got := rec.take(); len(got) != 0 {
			t.Errorf("lines after Close: %+v", got)
		}
	})
}

// The first line carries its event's context (its trace), the summary none.
func TestFirstLineKeepsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type ctxKey struct{}
		var seen []any
		var mu sync.Mutex
		h := ctxHandler{f: func(ctx context.Context) {
			mu.Lock()
			seen = append(seen, ctx.Value(ctxKey{}))
			mu.Unlock()
		}}
		l := New(slog.New(h), Options{})
		ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
		l.Log(ctx, slog.LevelWarn, "m", nil, "1")
		l.Log(ctx, slog.LevelWarn, "m", nil, "2")
		l.Flush()
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(seen) != "[trace-1 <nil>]" {
			t.Errorf("contexts %v, want the first line's and none", seen)
		}
	})
}

type ctxHandler struct{ f func(context.Context) }

func (h ctxHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h ctxHandler) Handle(ctx context.Context, _ slog.Record) error {
	h.f(ctx)
	return nil
}
func (h ctxHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h ctxHandler) WithGroup(string) slog.Handler      { return h }

// The lines render as a text handler writes them: the summary's group and
// ids read as one line.
func TestTextRendering(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b strings.Builder
		l := New(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		}})), Options{})
		for i := range 3 {
			failRoom(l, i+1)
		}
		l.Flush()
		want := `level=WARN msg="room failed" code=prefill_lost bootstrap_addr=10.0.0.1:8998 room=1 reason="lost 1"
level=WARN msg="room failed" code=prefill_lost bootstrap_addr=10.0.0.1:8998 count=2 ids="2 3" first.room=2 first.reason="lost 2" over=0s
`
		if b.String() != want {
			t.Errorf("rendered\n%s\nwant\n%s", b.String(), want)
		}
	})
}

// Events without ids: the summary has a count and no ids.
func TestNoIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, rec := newLogger(Options{})
		for range 3 {
			l.Log(context.Background(), slog.LevelWarn, "finished call", []slog.Attr{slog.String("grpc.code", "Unavailable")}, "", slog.Int("grpc.time_ms", 1))
		}
		l.Flush()
		got := rec.take()
		if len(got) != 2 || got[1].attrs["count"] != "2" || got[1].attrs["first.grpc.time_ms"] != "1" {
			t.Fatalf("%+v, want the first call and a summary of 2", got)
		}
		if _, ok := got[1].attrs["ids"]; ok {
			t.Errorf("summary %+v has ids", got[1])
		}
	})
}

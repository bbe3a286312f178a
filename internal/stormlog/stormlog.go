// Package stormlog logs what can happen to many rooms, batches or calls at
// once without a line for each: a prefill lost with a million rooms queued
// fails every one of them in the same instant, and a line per room would
// bury everything else in the log.
//
// Events are grouped by cause: a message and the attributes that name what
// went wrong (a failure code and a bootstrap address, a method and a gRPC
// code). A cause writes at most one line per interval. The first event of a
// quiet cause is logged at once with its own detail, exactly as a plain
// slog call would log it; the events of that cause that follow within the
// interval are counted, and when the interval ends one line reports them:
// the same message and cause, "count" (how many events the line stands
// for), "ids" (the ids of the first few, space-separated; absent when the
// events have none), "first" (the
// detail of the first of them, as a group) and "over" (the time from the
// first to the line). A cause quiet for a whole interval logs its next
// event at once again. The detail of every event stays where it belongs:
// the room's events and trace, and decodectl.
//
// The number of causes a Logger follows is bounded (Options.MaxCauses):
// past it, the events of a new cause are counted under their message alone
// with "other_causes"=true. Flush writes every pending summary now (a
// process about to exit calls it); Close flushes and stops the timer.
package stormlog

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Defaults of Options.
const (
	// DefaultInterval is the least time between two lines of one cause.
	DefaultInterval = 10 * time.Second
	// DefaultSamples is how many ids a summary line names.
	DefaultSamples = 5
	// DefaultMaxCauses bounds the causes a Logger follows at once.
	DefaultMaxCauses = 1024
)

// Options configure New; zero values take the defaults.
type Options struct {
	// Interval is the least time between two lines of one cause.
	Interval time.Duration
	// Samples is how many ids a summary line names.
	Samples int
	// MaxCauses bounds the causes followed at once.
	MaxCauses int
	// Clock times the intervals (kvlayout.RealClock when nil).
	Clock kvlayout.Clock
}

// Logger writes the lines of its events to an slog.Logger, at most one per
// cause per interval. It is safe for concurrent use; its zero value is not
// usable (New).
type Logger struct {
	log       *slog.Logger
	interval  time.Duration
	samples   int
	maxCauses int
	clock     kvlayout.Clock

	mu      sync.Mutex
	causes  map[string]*cause
	timer   kvlayout.Stopper
	armedAt time.Time // when the timer fires (zero: not armed)
	closed  bool
}

// cause is one cause's state: when it last wrote a line, and what it
// counted since.
type cause struct {
	key   string
	msg   string
	attrs []slog.Attr
	level slog.Level // the highest level counted since the last line
	last  time.Time  // when the cause last wrote a line (zero: never)
	n     int        // events counted since
	ids   []string   // the first Samples of their ids
	first []slog.Attr
	since time.Time // when the first of them came
}

// New returns a Logger writing to log (slog.Default() when nil).
func New(log *slog.Logger, o Options) *Logger {
	if log == nil {
		log = slog.Default()
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Samples <= 0 {
		o.Samples = DefaultSamples
	}
	if o.MaxCauses <= 0 {
		o.MaxCauses = DefaultMaxCauses
	}
	if o.Clock == nil {
		o.Clock = kvlayout.RealClock{}
	}
	return &Logger{log: log, interval: o.Interval, samples: o.Samples, maxCauses: o.MaxCauses, clock: o.Clock, causes: map[string]*cause{}}
}

// Slog is the logger the lines go to.
func (l *Logger) Slog() *slog.Logger { return l.log }

// Log records one event of the cause msg + causeAttrs at level: logged at
// once (msg, causeAttrs, then detail, with ctx) when the cause wrote no line
// within the interval, else counted into the cause's next summary under id
// ("" for an event without one).
// Nothing is recorded at a level the logger does not write.
func (l *Logger) Log(ctx context.Context, level slog.Level, msg string, causeAttrs []slog.Attr, id string, detail ...slog.Attr) {
	if !l.log.Enabled(ctx, level) {
		return
	}
	now := l.clock.Now()
	key := keyOf(msg, causeAttrs)
	l.mu.Lock()
	c := l.cause(key, msg, causeAttrs, now)
	if l.closed || (c.n == 0 && (c.last.IsZero() || now.Sub(c.last) >= l.interval)) {
		c.last = now
		l.mu.Unlock()
		own := causeAttrs
		if c.key != key { // counted with the other causes: said so
			own = append(slices.Clip(causeAttrs), otherCauses)
		}
		l.log.LogAttrs(ctx, level, msg, slices.Concat(own, detail)...)
		return
	}
	if c.n == 0 {
		c.level, c.first, c.since = level, slices.Clone(detail), now
	}
	c.n++
	c.level = max(c.level, level)
	if len(c.ids) < l.samples && id != "" {
		c.ids = append(c.ids, id)
	}
	l.arm(c.last.Add(l.interval), now)
	l.mu.Unlock()
}

// cause returns the cause of key, made when new (l.mu held). Past
// maxCauses, idle causes are forgotten first; a new cause beyond the bound
// is counted under its message alone.
func (l *Logger) cause(key, msg string, attrs []slog.Attr, now time.Time) *cause {
	if c := l.causes[key]; c != nil {
		return c
	}
	if len(l.causes) >= l.maxCauses {
		l.forgetIdle(now)
	}
	if len(l.causes) >= l.maxCauses {
		key, attrs = "\x01"+msg, []slog.Attr{otherCauses}
		if c := l.causes[key]; c != nil {
			return c
		}
	}
	c := &cause{key: key, msg: msg, attrs: slices.Clone(attrs)}
	l.causes[key] = c
	return c
}

// otherCauses marks the lines of the causes counted together past
// MaxCauses.
var otherCauses = slog.Bool("other_causes", true)

// forgetIdle forgets the causes with nothing counted whose last line is an
// interval old: their next event is logged at once anyway (l.mu held).
func (l *Logger) forgetIdle(now time.Time) {
	for k, c := range l.causes {
		if c.n == 0 && now.Sub(c.last) >= l.interval {
			delete(l.causes, k)
		}
	}
}

// arm keeps the timer at or before at (l.mu held).
func (l *Logger) arm(at, now time.Time) {
	if !l.armedAt.IsZero() && !at.Before(l.armedAt) {
		return
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.armedAt = at
	l.timer = l.clock.AfterFunc(max(at.Sub(now), 0), l.fire)
}

// fire writes the summaries whose interval ended and re-arms the timer for
// the next one.
func (l *Logger) fire() {
	l.mu.Lock()
	now := l.clock.Now()
	l.armedAt, l.timer = time.Time{}, nil
	recs := l.due(now, false)
	l.forgetIdle(now)
	var next time.Time
	for _, c := range l.causes {
		if c.n > 0 && (next.IsZero() || c.last.Add(l.interval).Before(next)) {
			next = c.last.Add(l.interval)
		}
	}
	if !next.IsZero() && !l.closed {
		l.arm(next, now)
	}
	l.mu.Unlock()
	l.write(recs)
}

// Flush writes every pending summary now.
func (l *Logger) Flush() {
	l.mu.Lock()
	recs := l.due(l.clock.Now(), true)
	l.stop()
	l.mu.Unlock()
	l.write(recs)
}

// Close flushes and stops the timer: events logged afterwards are written
// at once, one line each (nothing would report them later).
func (l *Logger) Close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.Flush()
}

// stop stops the timer (l.mu held).
func (l *Logger) stop() {
	if l.timer != nil {
		l.timer.Stop()
	}
	l.timer, l.armedAt = nil, time.Time{}
}

// summary is one summary line to write.
type summary struct {
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// due takes the summaries whose interval ended at now (all of them: every
// cause with something counted), in the order of their keys (l.mu held).
func (l *Logger) due(now time.Time, all bool) []summary {
	var out []summary
	keys := make([]string, 0, len(l.causes))
	for k, c := range l.causes {
		if c.n > 0 && (all || now.Sub(c.last) >= l.interval) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		c := l.causes[k]
		attrs := append(slices.Clip(c.attrs), slog.Int("count", c.n))
		if len(c.ids) > 0 {
			attrs = append(attrs, slog.String("ids", strings.Join(c.ids, " ")))
		}
		attrs = append(attrs, slog.Attr{Key: "first", Value: slog.GroupValue(c.first...)}, slog.Duration("over", now.Sub(c.since)))
		out = append(out, summary{level: c.level, msg: c.msg, attrs: attrs})
		c.last, c.n, c.ids, c.first = now, 0, nil, nil
	}
	return out
}

func (l *Logger) write(recs []summary) {
	for _, r := range recs {
		l.log.LogAttrs(context.Background(), r.level, r.msg, r.attrs...)
	}
}

// keyOf is a cause's key: its message and its attributes' keys and values.
func keyOf(msg string, attrs []slog.Attr) string {
	if len(attrs) == 0 {
		return msg
	}
	var b strings.Builder
	b.WriteString(msg)
	for _, a := range attrs {
		b.WriteByte(0)
		b.WriteString(a.Key)
		b.WriteByte('=')
		b.WriteString(a.Value.String())
	}
	return b.String()
}

package room

import (
	"fmt"
	"math/bits"
)

// coverage is one prefill rank's page coverage of a room's destination: a
// bitmap over the destination's page list (one bit per page, one allocation
// per rank and attempt, none per page or per chunk) of the pages sent (landed
// or in flight), and the count of pages landed. Success is declared on
// coverage, never on a count of chunks: a rank is done when every page has
// landed and its last chunk (with the room marker) landed.
type coverage struct {
	sent   []uint64 // bit i: page i of the destination was sent (landed or in flight)
	nSent  int
	landed int
	need   int
}

// init sizes the bitmap for a destination of need pages (once per attempt).
func (c *coverage) init(need int) {
	if c.sent == nil {
		c.sent = make([]uint64, (need+63)/64)
		c.need = need
	}
}

// overlap returns the first page of [off, off+n) already sent, or -1.
func (c *coverage) overlap(off, n int) int {
	for i := off; i < off+n; {
		w, b := i/64, uint(i%64)
		word := c.sent[w] >> b
		if word != 0 {
			p := i + bits.TrailingZeros64(word)
			if p < off+n {
				return p
			}
			return -1
		}
		i += 64 - int(b)
	}
	return -1
}

// mark sets (on) or clears pages [off, off+n) as sent.
func (c *coverage) mark(off, n int, on bool) {
	for i := off; i < off+n; i++ {
		w, b := i/64, uint(i%64)
		if on {
			c.sent[w] |= 1 << b
		} else {
			c.sent[w] &^= 1 << b
		}
	}
	if on {
		c.nSent += n
	} else {
		c.nSent -= n
	}
}

// complete: every page was sent (landed or in flight).
func (c *coverage) complete() bool { return c.nSent == c.need }

// firstGap describes the first range of pages not sent, for messages.
func (c *coverage) firstGap() string {
	start := -1
	for i := 0; i < c.need; i++ {
		sent := c.sent[i/64]&(1<<uint(i%64)) != 0
		switch {
		case !sent && start < 0:
			start = i
		case sent && start >= 0:
			return fmt.Sprintf("[%d, %d)", start, i)
		}
	}
	if start < 0 {
		return "none"
	}
	return fmt.Sprintf("[%d, %d)", start, c.need)
}

// RankCoverage is one required prefill rank's progress on a room.
type RankCoverage struct {
	CP, TP, PP    int
	Claimed       bool
	PagesLanded   int
	PagesRequired int
	LastLanded    bool
	Bytes         uint64
}

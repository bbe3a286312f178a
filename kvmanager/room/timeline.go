package room

import (
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// A room keeps its timeline compact: each transition is a note code and its
// numbers, and the note's text is rendered only when a snapshot, an event or
// a debug log shows it — nothing is formatted on the success path and no
// string is retained per queued room.

// noteCode says how a transition's note is rendered.
type noteCode uint8

const (
	noteText        noteCode = iota // text is the note (a failure's message); a kept transition holds its index in the room's texts
	noteConst                       // a: index in constNotes
	noteOpened                      // a: decode shard
	noteResolvingDP                 // a: dp_size, b: follow_bootstrap_room (0/1); the room's address
	noteDPResolved                  // a: prefill DP rank, b: DPRule
	noteResumed                     // a: pages
	noteAdmitted                    // a: pages, b: metadata slot
	noteClaimed                     // a: prefill ranks, b: timeouts.waiting (ns)
	noteChunkLanded                 // a: chunk index, b: the rank packed by packRank; the room's address
	noteSucceeded                   // a: chunks, b: bytes
	noteRebootstrap                 // a: attempt
)

// note is a transition's note before it is rendered.
type note struct {
	text string
	a, b int64
	code noteCode
}

// constNotes are the fixed notes; a transition holds one as its index.
var constNotes = [...]string{
	"chunks landed before every rank claimed",
	"released by the decode engine",
	"released at shutdown",
	"retracted: pages returned; resumes after the next ReportRunning, before new admissions",
	"held for rebootstrap until ContinueGeneration",
	PagesReusableNote,
}

// PagesReusableNote is the note of a room's last step when its pages
// became reusable after its end (its drain, its transfers in flight or a
// quarantine had held them).
const PagesReusableNote = "pages reusable: nothing may write into them any more"

// textNote is a note of text: one of constNotes, or a text of its own
// (which a kept transition stores in the room's texts).
func textNote(s string) note {
	for i, c := range constNotes {
		if c == s {
			return note{code: noteConst, a: int64(i), text: s}
		}
	}
	return note{text: s}
}

func numNote(code noteCode, a, b int64) note { return note{code: code, a: a, b: b} }

// chunkLandedNote is "chunk i from rank landed" (formatted at once for a
// rank beyond what packRank holds).
func chunkLandedNote(index int, rk ranks.RankID) note {
	if p, ok := packRank(rk); ok {
		return note{code: noteChunkLanded, a: int64(index), b: p}
	}
	return textNote(fmt.Sprintf("chunk %d from %s landed", index, rk))
}

// packRank packs a rank's DP, CP, TP and PP ranks, 16 bits each.
func packRank(rk ranks.RankID) (int64, bool) {
	for _, v := range [...]int{rk.DP, rk.CP, rk.TP, rk.PP} {
		if v < 0 || v >= 1<<15 {
			return 0, false
		}
	}
	return int64(rk.DP)<<48 | int64(rk.CP)<<32 | int64(rk.TP)<<16 | int64(rk.PP), true
}

func unpackRank(addr string, p int64) ranks.RankID {
	return ranks.RankID{Addr: addr, DP: int(p >> 48 & 0xffff), CP: int(p >> 32 & 0xffff), TP: int(p >> 16 & 0xffff), PP: int(p & 0xffff)}
}

// render is the note's text; addr is the room's prefill address.
func (n note) render(addr string) string {
	switch n.code {
	case noteOpened:
		return fmt.Sprintf("opened on decode shard %d", n.a)
	case noteResolvingDP:
		return fmt.Sprintf("%s: dp_size %d, follow_bootstrap_room %v: waiting for BindRoom", addr, n.a, n.b != 0)
	case noteDPResolved:
		return fmt.Sprintf("prefill dp rank %d (%s)", n.a, ranks.DPRule(n.b))
	case noteResumed:
		return fmt.Sprintf("resumed after retraction with %d pages", n.a)
	case noteAdmitted:
		return fmt.Sprintf("%d pages, metadata slot %d", n.a, n.b)
	case noteClaimed:
		return fmt.Sprintf("destination claimed by %d prefill ranks; waiting timeout %s", n.a, time.Duration(n.b))
	case noteChunkLanded:
		return fmt.Sprintf("chunk %d from %s landed", n.a, unpackRank(addr, n.b))
	case noteSucceeded:
		return fmt.Sprintf("%d chunks, %d bytes", n.a, n.b)
	case noteRebootstrap:
		return fmt.Sprintf("rebootstrap attempt %d", n.a)
	case noteConst:
		if n.a >= 0 && n.a < int64(len(constNotes)) {
			return constNotes[n.a]
		}
	}
	return n.text
}

// transition is one step of a room's timeline as the room keeps it (32
// bytes): the time in Unix nanoseconds, the note flattened (a text of its
// own as its index in the room's texts), the SGLang label as its index in
// sglangLabels.
type transition struct {
	at      int64
	a, b    int64
	attempt uint32
	code    noteCode
	sglang  uint8
	phase   uint8
}

// sglangLabels are the SGLang transition labels a room's timeline uses
// (index 0: decodeplane's own step).
var sglangLabels = [...]string{"", "T1", "T2/T4/T8", "T3", "T11", "T12/T17", "T13/T18", "T14", "T15", "T16", "T18", "T19", "T20", "T21", "T22"}

// sglangIndex is a label's index in sglangLabels, ok false for a label not
// listed there.
func sglangIndex(label string) (uint8, bool) {
	for i, l := range sglangLabels {
		if l == label {
			return uint8(i), true
		}
	}
	return 0, false
}

// needsText reports whether a transition with this label and note keeps a
// text of its own (newTransition's texts must then be given).
func needsText(sglang string, n note) bool {
	_, ok := sglangIndex(sglang)
	return n.code == noteText || (!ok && n.code == noteConst)
}

// newTransition records a transition; a text of its own is appended to
// texts (see needsText; nil drops it).
func newTransition(at time.Time, to Phase, sglang string, n note, attempt uint32, texts *[]string) transition {
	idx, ok := sglangIndex(sglang)
	if !ok && (n.code == noteText || n.code == noteConst) { // not a known label: keep it in the note
		n = note{text: sglang + ": " + n.render("")}
	}
	t := transition{at: at.UnixNano(), a: n.a, b: n.b, attempt: attempt, code: n.code, sglang: idx, phase: uint8(to)}
	if n.code == noteText {
		t.a = -1
		if texts != nil {
			t.a = int64(len(*texts))
			*texts = append(*texts, n.text)
		}
	}
	return t
}

func (t transition) note(texts []string) note {
	n := note{a: t.a, b: t.b, code: t.code}
	if t.code == noteText && t.a >= 0 && t.a < int64(len(texts)) {
		n.text = texts[t.a]
	}
	return n
}

// public renders the transition; addr is the room's prefill address, texts
// the room's texts.
func (t transition) public(addr string, texts []string) Transition {
	p := Phase(t.phase)
	return Transition{Phase: p, Poll: p.Poll(), At: time.Unix(0, t.at), SGLang: sglangLabels[t.sglang], Note: t.note(texts).render(addr), Attempt: t.attempt}
}

// texts are the room's notes of text of their own (nil when none).
func (r *Room) texts() []string {
	if r.extra == nil {
		return nil
	}
	return r.extra.texts
}

// opened is the room's first transition (OpenRoom's, T1), which the room
// does not keep: everything in it is the room's (its opening time and
// decode shard; attempt 1).
func (r *Room) opened() transition {
	return transition{at: int64(r.openedAt), a: int64(r.decodeDP), attempt: 1, code: noteOpened, sglang: sglangT1, phase: uint8(PhaseWaitingPrefill)}
}

// sglangT1 is T1's index in sglangLabels.
const sglangT1 = 1

// steps is the room's whole timeline, OpenRoom's transition first.
func (r *Room) steps() []transition {
	out := make([]transition, 0, 1+len(r.transitions))
	return append(append(out, r.opened()), r.transitions...)
}

// lastStep is the room's latest transition.
func (r *Room) lastStep() transition {
	if n := len(r.transitions); n > 0 {
		return r.transitions[n-1]
	}
	return r.opened()
}

// timeline renders the room's transitions.
func (r *Room) timeline() []Transition {
	steps := r.steps()
	out := make([]Transition, len(steps))
	texts := r.texts()
	for i, t := range steps {
		out[i] = t.public(r.addr, texts)
	}
	return out
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Step is one transition of a room's timeline as the room keeps it.
type Step struct{ t transition }

// Public renders the step; addr is the room's prefill address, texts the
// room's texts (Texts).
func (s Step) Public(addr string, texts []string) Transition { return s.t.public(addr, texts) }

// Phase is the phase the step moved to.
func (s Step) Phase() Phase { return Phase(s.t.phase) }

// At is when the step was taken.
func (s Step) At() time.Time { return time.Unix(0, s.t.at) }

// Texts are the room's notes of text of their own (nil when none).
func (r *Room) Texts() []string { return r.texts() }

// Steps is the room's whole timeline, OpenRoom's transition first.
func (r *Room) Steps() []Step {
	out := make([]Step, 0, 1+len(r.transitions))
	out = append(out, Step{r.opened()})
	for _, t := range r.transitions {
		out = append(out, Step{t})
	}
	return out
}

// Seq is the position of the room's last transition in its timeline (1:
// its opening).
func (r *Room) Seq() uint32 { return uint32(1 + len(r.transitions)) }

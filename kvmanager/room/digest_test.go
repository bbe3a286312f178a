package room

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
	"github.com/decodeplane/decodeplane/transfer"
)

// This file renders what an event did (eff, digest) so that table rows can
// compare it, and says how two differ.

// eff is what a row expects of one event: every effect that matters,
// rendered comparable, and the room's phase and deadline after it. A field
// left zero asserts the effect is absent.
type eff struct {
	Err         string // errClass
	Move        string // "from -> to label"
	Note        string
	Begin       string
	Ack         string
	Then        Then
	Unwait      bool
	Cancel      bool
	Reply       string // destEvent
	Refuse      string
	EndClaims   bool
	ClaimEnd    string
	Owing       string
	Offer       string
	Failure     string // code
	Finished    string // outcome [code]
	SinceOpen   time.Duration
	Transferred time.Duration
	Chunk       string
	Admission   bool
	AdmittedAft time.Duration
	Resolved    string // "dp N rule"
	Ledger      string
	AdmitNow    bool
	StagingOpen bool
	Drain       string
	Quarantine  string
	End         bool
	Release     bool

	Phase Phase  // after the event
	Next  string // NextDeadline after the event: "" none, else the time since t0
}

// digest renders e (and the room after it) as an eff.
func digest(r *Room, e Effects) eff {
	d := eff{Err: errClass(e.Err), Then: e.Then, Unwait: e.Unwait, Cancel: e.Cancel, Reply: destEvent(e.Reply),
		EndClaims: e.EndClaims, SinceOpen: e.SinceOpen, Transferred: e.Transferred, Admission: e.Admission, AdmittedAft: e.AdmittedAfter,
		Ledger: ledgerOps(e.Ledger), AdmitNow: e.AdmitNow, StagingOpen: e.StagingOpen, End: e.End, Release: e.Release,
		Phase: r.Phase(), Next: since(r.NextDeadline())}
	if m := e.Move; m.Moved {
		d.Move = fmt.Sprintf("%s -> %s %s", m.From, m.To, m.SGLang)
		d.Note = m.Note(r.Addr())
	}
	switch b := e.Begin; {
	case b.Fresh:
		d.Begin = "fresh"
	case b.Busy:
		d.Begin = "busy"
	case b.Done && b.Err != nil:
		d.Begin = "done " + errClass(b.Err)
	case b.Done:
		d.Begin = fmt.Sprintf("done %d bytes", b.Result.Bytes)
	}
	if a := e.AckResult; a != (AckResult{}) {
		d.Ack = fmt.Sprintf("owed %v remaining %d released %v", a.Owed, a.Remaining, a.Released)
	}
	var refused []string
	for _, rf := range e.Refuse {
		refused = append(refused, fmt.Sprintf("%+v %s", rf.Rank, destEvent(&rf.Event)))
	}
	slices.Sort(refused)
	d.Refuse = strings.Join(refused, "; ")
	if e.EndClaims || e.ClaimEnd != (DestinationEvent{}) {
		d.ClaimEnd = destEvent(&e.ClaimEnd)
	}
	if e.Owing != nil {
		d.Owing = RankList(e.Owing)
	}
	switch e.Offer {
	case OfferAll:
		d.Offer = "all"
	case OfferOne:
		d.Offer = fmt.Sprintf("one %+v", e.OfferTo)
	}
	if e.Failure != nil {
		d.Failure = e.Failure.Code.String()
	}
	if e.Finished {
		d.Finished = e.Outcome.String()
		if e.Code != FailureUnspecified {
			d.Finished += " " + e.Code.String()
		}
	}
	if e.Chunk {
		d.Chunk = fmt.Sprintf("ok %v %d bytes", e.ChunkOK, e.ChunkRes.Bytes)
	}
	if e.Resolved {
		d.Resolved = fmt.Sprintf("dp %d %s", e.DP, e.Rule)
	}
	if e.DrainStarted || e.DrainExpired || e.Acked || !reflect.DeepEqual(e.Drain, DrainNote{}) {
		var flags []string
		for _, f := range []struct {
			on   bool
			name string
		}{{e.DrainStarted, "started"}, {e.DrainExpired, "expired"}, {e.Acked, "acked"}} {
			if f.on {
				flags = append(flags, f.name)
			}
		}
		d.Drain = fmt.Sprintf("%s: attempt %d ranks %s until %s acks %d", strings.Join(flags, ","), e.Drain.Attempt, rankListOrNone(e.Drain.Ranks), since(e.Drain.Until), e.Drain.Acks)
	}
	d.Quarantine = since(e.QuarantineUntil)
	return d
}

func rankListOrNone(rs []RankID) string {
	if rs == nil {
		return "none"
	}
	return RankList(rs)
}

// since renders a time as its offset from t0 ("" for none).
func since(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return at.Sub(t0).String()
}

// errClass is how an error is told apart: its field for a field error,
// else the sentinel errors.Is finds.
func errClass(err error) string {
	if err == nil {
		return ""
	}
	var inv *kvlayout.Invalid
	switch {
	case errors.As(err, &inv):
		return "invalid " + inv.Field
	case errors.Is(err, ErrStaleAttempt):
		return "stale_attempt"
	case errors.Is(err, ErrWrongState):
		return "wrong_state"
	case errors.Is(err, registry.ErrDPRankConflict):
		return "dp_rank_conflict"
	case errors.Is(err, registry.ErrPrefillNotFound):
		return "prefill_not_found"
	case errors.Is(err, transfer.ErrTransferFailed):
		return "transfer_failed"
	case errors.Is(err, transfer.ErrEngineUnavailable):
		return "engine_unavailable"
	}
	return "other: " + err.Error()
}

// destEvent renders a claim stream's event.
func destEvent(d *DestinationEvent) string {
	if d == nil {
		return ""
	}
	var parts []string
	if d.Destination != nil {
		parts = append(parts, "destination")
	}
	if d.Failure != nil {
		parts = append(parts, "failure "+d.Failure.Code.String())
	}
	if d.Done != nil {
		parts = append(parts, "done "+d.Done.String())
	}
	if d.AckRequired {
		parts = append(parts, "ack_required")
	}
	if d.Refused != nil {
		parts = append(parts, "refused "+errClass(d.Refused))
	}
	if len(parts) == 0 {
		return "empty"
	}
	return strings.Join(parts, " ")
}

func ledgerOps(op LedgerOp) string {
	var out []string
	for i, n := range []string{"ready", "claim", "running", "drain", "release"} {
		if op&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return strings.Join(out, "|")
}

// text is what an event said: the failure's message, else the error's,
// else the reply's failure.
func text(e Effects) string {
	switch {
	case e.Failure != nil:
		return e.Failure.Message
	case e.Err != nil:
		return e.Err.Error()
	case e.Reply != nil && e.Reply.Failure != nil:
		return e.Reply.Failure.Message
	}
	return ""
}

// diff lists the fields of got that differ from want.
func diff(got, want eff) string {
	var out []string
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if g, w := gv.Field(i).Interface(), wv.Field(i).Interface(); g != w {
			out = append(out, fmt.Sprintf("%s: got %#v, want %#v", gv.Type().Field(i).Name, g, w))
		}
	}
	return strings.Join(out, "\n\t")
}

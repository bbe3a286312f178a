package kvmanager

import (
	"fmt"
	"strings"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
)

// The rank mapping and the per-instance rank plan are the registry's
// (kvmanager/registry); this file keeps the room's side of the plan.

// progress returns a required rank's progress in this attempt, created on
// first use (a claim or a chunk from that rank); nil for a rank the room does
// not need. The table grows only with the calls received, never with the
// prefill's parallel sizes.
func (r *room) progress(k rankKey) *rankProgress {
	if r.handoff == nil { // never admitted: no rank has anything to report yet
		return nil
	}
	if rp := r.ranks.get(k); rp != nil {
		return rp
	}
	if r.plan == nil || !r.plan.IsRequired(k) {
		return nil
	}
	if r.ranks == nil {
		r.ranks = &rankSet{}
	}
	return r.ranks.add(k)
}

// listRanks renders at most maxListedRanks rank keys and how many more.
func listRanks(keys []rankKey, more int) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "cp %d tp %d pp %d", k.CP, k.TP, k.PP)
	}
	if more > 0 {
		fmt.Fprintf(&b, "; and %d more", more)
	}
	return b.String()
}

// maxListedRanks bounds every list of ranks in a message or a status.
const maxListedRanks = registry.MaxListedRanks

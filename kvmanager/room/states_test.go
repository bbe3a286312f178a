package room

import "testing"

// Every state the tables start from is reached by events alone and is
// where its name says, with its deadline, on every plan the rows use.
func TestStatesAreReachedByEvents(t *testing.T) {
	for _, s := range []state{stWaitingPrefill, stResolving, stQueued, stAdmitted, stClaimed, stTransferring, stLandedNoMarker,
		stSucceeded, stReleased, stFailed, stRetracted, stHeld, stRebootstrapped, stRequeued, stReadmitted, stAdopted,
		stAdmitted.with("tp 2", withTP2), stClaimed.with("tp 2", withTP2), stTransferring.with("tp 2", withTP2),
		stAdmitted.with("staged", withStaging), stSucceeded.with("staged", withStaging)} {
		t.Run(s.name, func(t *testing.T) {
			g := newRig(t, s.opts...)
			s.build(g)
			if g.r.Phase() != s.phase || since(g.r.NextDeadline()) != s.next {
				t.Errorf("phase %s, deadline %q; want %s, %q", g.r.Phase(), since(g.r.NextDeadline()), s.phase, s.next)
			}
		})
	}
}

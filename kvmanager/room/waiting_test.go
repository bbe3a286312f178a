package room

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvmanager/registry"
)

// WaitingFor says, per phase, what a room waits for, who must act, and the
// bound that ends the wait (with its time).
func TestWaitingFor(t *testing.T) {
	const (
		boot = " until 2023-11-14T22:18:20Z" // t0 + timeouts.bootstrap
		wait = " until 2023-11-14T22:14:23Z" // tClaim + timeouts.waiting
	)
	withURL := WaitView{GenerateURL: "http://10.0.0.1:30000/generate"}
	for _, c := range []struct {
		name string
		from state
		prep func(*rig)
		view WaitView
		want string
	}{
		{name: "the prefill's registration", from: stWaitingPrefill, view: WaitView{Registered: 1, Expected: 2},
			want: "the registration of prefill instance 10.0.0.1:8998 (1 of 2 ranks registered); bounded by SGLang's registration retries and timeouts.bootstrap" + boot},
		{name: "a BindRoom", from: stResolving,
			want: "the prefill DP rank of the room: a BindRoom from 10.0.0.1:8998 (or a router hint); bounded by timeouts.dp_rank_resolution until 2023-11-14T22:13:51Z"},
		{name: "admission", from: stQueued, view: WaitView{Blocked: "none"},
			want: "KV admission on decode DP shard 0 (the rooms ahead of it); bounded by timeouts.bootstrap" + boot},
		{name: "admission blocked", from: stQueued, view: WaitView{Blocked: "pages"},
			want: "KV admission on decode DP shard 0 (blocked by pages); bounded by timeouts.bootstrap" + boot},
		{name: "the engine's resync", from: stQueued, view: WaitView{ResyncUntil: sec(40), Blocked: "pages"},
			want: "the decode engine's resync (admission is held until the engine re-declared the rooms it still runs); bounded by engine.resync_timeout until 2023-11-14T22:14:00Z, then KV admission on decode DP shard 0; the room itself by timeouts.bootstrap" + boot},
		{name: "the claims", from: stAdmitted,
			want: "the destination's claim (AwaitDestination) by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998; bounded by admission.claim_timeout and timeouts.bootstrap" + boot},
		{name: "the claims of the ranks that did not claim", from: stAdmitted.with("tp 2", withTP2),
			prep: func(g *rig) { g.apply(Delivered{Now: tClaim, Rank: g.rank(1).Key(), Attempt: 1}) },
			want: "the destination's claim (AwaitDestination) by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998; bounded by admission.claim_timeout and timeouts.bootstrap" + boot},
		{name: "T23: a rebootstrap's claims after the recompute", from: stReadmitted, view: withURL,
			want: "the destination's claim (AwaitDestination) by prefill ranks cp 0 tp 0 pp 0 of 10.0.0.1:8998; bounded by admission.claim_timeout and timeouts.bootstrap until 2023-11-14T22:18:29Z" +
				"; rebootstrap attempt 2: the prefill sends only after the decode engine's recompute request (POST http://10.0.0.1:30000/generate, pinned to prefill DP rank 0, from ContinueGeneration's answer)"},
		{name: "the KV of a claimed room", from: stClaimed,
			want: "KV pages from prefill ranks cp 0 tp 0 pp 0 (0 of 4 pages landed, last chunk not landed) of 10.0.0.1:8998; bounded by timeouts.waiting" + wait},
		{name: "the KV still to land", from: stTransferring.with("tp 2", withTP2),
			prep: func(g *rig) { g.land(g.rank(1), 1, 0) },
			want: "KV pages from prefill ranks cp 0 tp 0 pp 0 (2 of 4 pages landed, last chunk not landed) of 10.0.0.1:8998; bounded by timeouts.waiting" + wait},
		{name: "the marker", from: stLandedNoMarker,
			want: "the room marker in the metadata slot (aux with the last chunk); bounded by timeouts.waiting" + wait},
		{name: "the scatters, bounded by their completion timeout", from: stClaimed.with("staged", withStaging),
			prep: func(g *rig) { g.scattersPending = true; g.landAll(roomID) },
			want: "the scatter of staged regions into the room's pages; bounded by timeouts.waiting until 2023-11-14T22:14:24Z"},
		{name: "the success check", from: stTransferring,
			prep: func(g *rig) { // the last chunk landed with the marker; the check did not run yet
				req := g.chunk(g.rank(0), 1)
				g.apply(ChunkBegin{Now: tLand, Req: req, Via: ViaEngine})
				g.apply(ChunkEnd{Now: tLand, Req: req, Via: ViaEngine, Result: resultWithMarker})
			},
			want: "the success check; bounded by timeouts.waiting" + wait},
		{name: "the engine's release", from: stSucceeded, want: "ReleaseRoom from the decode engine (it owns the pages until then)"},
		{name: "resumption", from: stRetracted,
			want: "resumption on decode DP shard 0: its pages come back before any new admission; bounded by timeouts.retracted until 2023-11-14T22:15:05Z"},
		{name: "ContinueGeneration", from: stHeld,
			want: "ContinueGeneration (rebootstrap: the room re-enters bootstrap on its pinned prefill DP rank, then the decode engine POSTs the recompute to the prefill's /generate named in ContinueGeneration's answer); bounded by timeouts.held until 2023-11-14T22:16:45Z"},
		{name: "the acks of a draining room", from: draining(),
			want: "AckRoomEnd (attempt 1) from prefill ranks [cp 0 tp 0 pp 0]: its pages are draining, not free; bounded by release.deferred_timeout until 2023-11-14T22:13:35Z"},
		{name: "the acks of a room whose drain waits for a chunk in flight", from: stClaimed.with("tp 2, deferred", withTP2, withDeferred),
			prep: func(g *rig) { started(0)(g); g.apply(Fail{Now: tDone, Failure: aborted, SelfWriter: true}) },
			want: "AckRoomEnd (attempt 1) from prefill ranks [cp 0 tp 1 pp 0]: its pages are draining, not free; once nothing is in flight, then bounded by release.deferred_timeout"},
		{name: "nothing: failed", from: stFailed},
		{name: "nothing: released", from: stReleased},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := newRig(t, c.from.opts...)
			c.from.build(g)
			if c.prep != nil {
				c.prep(g)
			}
			if got := g.r.WaitingFor(c.view); got != c.want {
				t.Errorf("waiting for\n\t%q\nwant\n\t%q", got, c.want)
			}
		})
	}
}

// RankList names at most MaxListedRanks ranks and counts the others.
func TestRankList(t *testing.T) {
	var rs []RankID
	for tp := range MaxListedRanks + 2 {
		rs = append(rs, RankID{Addr: addrA, TP: tp})
	}
	if got, want := RankList(rs[:1]), "[cp 0 tp 0 pp 0]"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got, want := RankList(rs), "[cp 0 tp 0 pp 0; cp 0 tp 1 pp 0; cp 0 tp 2 pp 0; cp 0 tp 3 pp 0; cp 0 tp 4 pp 0; cp 0 tp 5 pp 0; cp 0 tp 6 pp 0; cp 0 tp 7 pp 0; and 2 more]"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
	if MaxListedRanks != registry.MaxListedRanks {
		t.Error("the room lists ranks by another bound than the registry")
	}
}

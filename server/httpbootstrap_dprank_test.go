package server_test

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/metadata"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestHTTPQueryDPRanksAnswersBindingsOnly: POST /query_dp_ranks answers
// exactly what SGLang's bootstrap server answers — the rooms bound with
// /register_dp_rank (or BindRoom, one table), every other room omitted —
// for an instance of dp_size 1, one balanced by follow_bootstrap_room, one
// not fully registered yet, and one never registered; Bootstrap.LookupDPRanks
// keeps applying every rule over gRPC.
func TestHTTPQueryDPRanksAnswersBindingsOnly(t *testing.T) {
	b := newHTTPBoot(t, httpToken)
	auth := "Bearer " + httpToken
	ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", auth)
	at := func(inst, route string) string { return "/instances/" + inst + route }
	lookup := func(inst string, room uint64) []*pb.DPRankResult {
		t.Helper()
		lk, err := b.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: inst, Rooms: []uint64{room}})
		if err != nil {
			t.Fatalf("LookupDPRanks(%s, %d): %v", inst, room, err)
		}
		return lk.GetResolved()
	}

	// dp_size 1: the decode resolves every room to 0 by itself; SGLang's
	// prefill never binds, so its server answers nothing.
	single := "10.1.0.1:8998"
	b.want(t, "PUT", at(single, "/route"), auth, putBody(1, 0, 1, 0, "10.1.0.1", 17000, 16, "bf16", "follow_bootstrap_room", 30000), 200, "OK")
	b.want(t, "POST", at(single, "/query_dp_ranks"), "", `{"bootstrap_rooms": [9, 10]}`, 200, "{}")
	if r := lookup(single, 9); len(r) != 1 || r[0].GetRule() != pb.DPRankRule_DP_RANK_RULE_SINGLE_DP {
		t.Errorf("LookupDPRanks(dp_size 1, room 9) = %v; want the single-DP rule", r)
	}
	b.want(t, "POST", at(single, "/register_dp_rank"), auth, `{"bootstrap_room": 9, "dp_rank": 0}`, 200, "OK")
	b.want(t, "POST", at(single, "/query_dp_ranks"), "", `{"bootstrap_rooms": [9, 10]}`, 200, `{"9": 0}`)

	// follow_bootstrap_room, dp_size 2: room % 2 on the decode side; only
	// a bound room over HTTP.
	follow := "10.2.0.1:8998"
	for dp := range 2 {
		b.want(t, "PUT", at(follow, "/route"), auth, putBody(1, 0, 2, dp, "10.2.0.1", 17100+dp, 16, "bf16", "follow_bootstrap_room", 30000), 200, "OK")
	}
	b.want(t, "POST", at(follow, "/query_dp_ranks"), "", `{"bootstrap_rooms": [4, 5]}`, 200, "{}")
	if r := lookup(follow, 5); len(r) != 1 || r[0].GetDpRank() != 1 || r[0].GetRule() != pb.DPRankRule_DP_RANK_RULE_FOLLOW_ROOM {
		t.Errorf("LookupDPRanks(follow_bootstrap_room, room 5) = %v; want 1 by room %% dp_size", r)
	}
	b.want(t, "POST", at(follow, "/register_dp_rank"), auth, `{"bootstrap_room": 5, "dp_rank": 1}`, 200, "OK")
	b.want(t, "POST", at(follow, "/query_dp_ranks"), "", `{"bootstrap_rooms": [4, 5]}`, 200, `{"5": 1}`)

	// Not fully registered (1 of 4 ranks): SGLang's table answers a bound
	// room all the same; LookupDPRanks waits for the whole instance.
	partial := "10.3.0.1:8998"
	b.want(t, "PUT", at(partial, "/route"), auth, putBody(2, 0, 2, 0, "10.3.0.1", 17200, 16, "bf16", "round_robin", 30000), 200, "OK")
	b.want(t, "POST", at(partial, "/register_dp_rank"), auth, `{"bootstrap_room": 7, "dp_rank": 1}`, 200, "OK")
	b.want(t, "POST", at(partial, "/query_dp_ranks"), "", `{"bootstrap_rooms": [6, 7]}`, 200, `{"7": 1}`)
	if _, err := b.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: partial, Rooms: []uint64{7}}); err == nil {
		t.Error("LookupDPRanks of an instance not fully registered answered")
	}

	// Never registered: no bindings, {} (as a fresh SGLang server).
	b.want(t, "POST", at("10.4.0.1:8998", "/query_dp_ranks"), "", `{"bootstrap_rooms": [1, 2]}`, 200, "{}")
	b.want(t, "POST", "/query_dp_ranks", "", fmt.Sprintf(`{"bootstrap_rooms": [%d]}`, uint64(1)<<62), 200, "{}")
}

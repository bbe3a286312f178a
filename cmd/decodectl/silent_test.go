package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestWritePrefillsSilentRanks: liveness is per rank, so the prefills view
// names the ranks whose heartbeat is overdue, with how long and how many
// intervals, and counts those the daemon did not list.
func TestWritePrefillsSilentRanks(t *testing.T) {
	var b bytes.Buffer
	err := writePrefills(&b, []*pb.PrefillStatus{
		{BootstrapAddr: "10.0.0.1:8998", RegisteredRanks: 2, ExpectedRanks: 2, AttnTpSize: 2, DpSize: 1, PpSize: 1, LastHeartbeat: ts(-time.Second), MissedHeartbeats: 1, Liveness: "heartbeat",
			SilentRanks: []*pb.SilentRank{
				{Rank: &pb.PrefillRank{BootstrapAddr: "10.0.0.1:8998", TpRank: 1}, SilentFor: durationpb.New(7 * time.Second), MissedHeartbeats: 1},
			}, SilentRankCount: 3},
		{BootstrapAddr: "10.0.0.2:8998", RegisteredRanks: 1, ExpectedRanks: 1, AttnTpSize: 1, DpSize: 1, PpSize: 1, LastHeartbeat: ts(-time.Second), Liveness: "heartbeat"},
	}, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := `PREFILL        RANKS  TP/DP/PP  LIVENESS    LAST HEARTBEAT  MISSED  ACTIVE ROOMS
10.0.0.1:8998  2/2    2/1/1     heartbeats  1.0s ago        1       0
10.0.0.2:8998  1/1    1/1/1     heartbeats  1.0s ago        0       0
10.0.0.1:8998 silent ranks: dp 0 cp 0 tp 1 pp 0 for 7.0s (1 missed), and 2 more
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("prefills (-want +got):\n%s", diff)
	}
}

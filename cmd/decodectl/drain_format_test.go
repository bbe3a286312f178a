package main

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestWriteShardsDraining: a shard with rooms waiting for AckRoomEnd gets
// the DRAINING ROOMS/PAGES column (absent while no shard drains).
func TestWriteShardsDraining(t *testing.T) {
	var b bytes.Buffer
	err := writeShards(&b, []*pb.ShardStatus{
		{DpRank: 0, PagesTotal: 512, PagesFree: 137, ReqSlotsTotal: 8, ReqSlotsFree: 7, MetadataSlotsTotal: 16, MetadataSlotsFree: 15,
			BlockedBy: "tokens", DrainingRooms: 1, DrainingPages: 375},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `SHARD  PAGES USED       REQ SLOTS  META SLOTS  QUEUE WAIT/READY  ADMITTED/CLAIMED/RUNNING  DRAINING ROOMS/PAGES  BLOCKED BY
0      375/512 (73.2%)  1/8        1/16        0/0               0/0/0                     1/375                 tokens
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("shards (-want +got):\n%s", diff)
	}
}

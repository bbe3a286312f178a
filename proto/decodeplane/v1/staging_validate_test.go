package decodeplanev1

import (
	"strings"
	"testing"
)

func TestStagingValidate(t *testing.T) {
	rank := &PrefillRank{BootstrapAddr: "10.0.0.1:8998"}
	tests := []struct {
		name string
		msg  interface{ Validate() error }
		want string // "" = valid; else a substring of the error
	}{
		{"setup ok", &SetupStagingRequest{Rank: rank}, ""},
		{"setup without rank", &SetupStagingRequest{}, "rank: is required"},
		{"allocate ok", &AllocateStagingRequest{Room: 1, Rank: rank, NumPages: 4}, ""},
		{"allocate 0 pages", &AllocateStagingRequest{Room: 1, Rank: rank}, "num_pages"},
		{"allocate bad addr", &AllocateStagingRequest{Room: 1, Rank: &PrefillRank{BootstrapAddr: "nohost"}, NumPages: 1}, "rank.bootstrap_addr"},
		{"chunk ready ok", &ChunkReadyRequest{Room: 1, Rank: rank, NumPages: 1, Last: true, Aux: &Aux{RoomMarker: 1, OutputIds: []int32{1}}}, ""},
		{"aux before the last chunk", &ChunkReadyRequest{Room: 1, Rank: rank, NumPages: 1, Aux: &Aux{RoomMarker: 1}}, "aux"},
		{"too many output ids", &ChunkReadyRequest{Room: 1, Rank: rank, NumPages: 1, Last: true, Aux: &Aux{OutputIds: make([]int32, 15)}}, "at most 14"},
		{"room out of range", &ChunkReadyRequest{Room: 1 << 63, Rank: rank, NumPages: 1}, "room"},
		{"watch ok", &WatchWatermarkRequest{DecodeTpRanks: []uint32{0, 3}}, ""},
		{"watch implausible rank", &WatchWatermarkRequest{DecodeTpRanks: []uint32{MaxWatchTPRanks}}, "decode_tp_ranks[0]"},
	}
	for _, tc := range tests {
		err := tc.msg.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func FuzzStagingValidate(f *testing.F) {
	f.Add("10.0.0.1:8998", uint64(1), uint32(0), uint32(1), true, uint64(1), 3)
	f.Add("", uint64(1<<63), uint32(7), uint32(0), false, uint64(0), 20)
	f.Fuzz(func(t *testing.T, addr string, room uint64, chunk, pages uint32, last bool, marker uint64, ids int) {
		rank := &PrefillRank{BootstrapAddr: addr}
		ids = min(max(ids, 0), 64)
		msgs := []interface{ Validate() error }{
			&SetupStagingRequest{Rank: rank},
			&AllocateStagingRequest{Room: room, Rank: rank, ChunkIndex: chunk, NumPages: pages},
			&ChunkReadyRequest{Room: room, Rank: rank, ChunkIndex: chunk, NumPages: pages, Last: last, Aux: &Aux{RoomMarker: marker, OutputIds: make([]int32, ids)}},
			&WatchWatermarkRequest{DecodeDpRank: chunk, DecodeTpRanks: []uint32{pages}},
		}
		for _, m := range msgs {
			err := m.Validate() // must not panic
			if err != nil && err.Error() == "" {
				t.Errorf("%T: an error without a message", m)
			}
		}
		if err := (&AllocateStagingRequest{Room: room, Rank: rank, NumPages: pages}).Validate(); err == nil && (pages == 0 || room > maxRoom) {
			t.Errorf("AllocateStaging(room %d, pages %d) passed validation", room, pages)
		}
	})
}

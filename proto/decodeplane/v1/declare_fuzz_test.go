package decodeplanev1

import "testing"

// Fuzz targets for the engine owner's requests (see fuzz_test.go for the
// contract every target checks).

func FuzzDeclareDestination(f *testing.F) {
	fuzzValidate(f, func() *DeclareDestinationRequest { return new(DeclareDestinationRequest) }, func(b *bounds, m *DeclareDestinationRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		b.need(len(m.GetPageIndices()) <= 1<<24, "page_indices <= 2^24 entries")
		for _, p := range m.GetPageIndices() {
			b.need(p >= 0, "page_indices[i] >= 0")
		}
		b.need(m.GetMetadataSlot() >= 0, "metadata_slot >= 0")
		b.need(m.GetDecodePrefixLen() <= 1<<24, "decode_prefix_len <= 2^24")
		b.need(len(m.GetState()) <= 4, "state <= 4 entries")
		seen := map[StateType]bool{}
		for _, s := range m.GetState() {
			t := s.GetType()
			b.need(t >= StateType_STATE_TYPE_MAMBA && t <= StateType_STATE_TYPE_DSA, "state[i].type defined")
			b.need(!seen[t], "state[i].type once")
			seen[t] = true
			for _, v := range s.GetIndices() {
				b.need(v >= 0, "state[i].indices[j] >= 0")
			}
		}
	}, &DeclareDestinationRequest{Room: 5, PageIndices: []int32{4, 5, 6}, MetadataSlot: 2},
		&DeclareDestinationRequest{Room: 6, PageIndices: []int32{1}, State: []*StateIndices{{Type: StateType_STATE_TYPE_MAMBA, Indices: []int32{3}}}, DecodePrefixLen: 64})
}

func FuzzReportCapacity(f *testing.F) {
	fuzzValidate(f, func() *ReportCapacityRequest { return new(ReportCapacityRequest) }, func(b *bounds, m *ReportCapacityRequest) {
		b.need(m.GetDecodeDpRank() < 1024, "decode_dp_rank < 1024")
		b.need(m.GetTokensFree() <= 1<<40 && m.GetPagesFree() <= 1<<40 && m.GetStateSlotsFree() <= 1<<40, "64-bit figures <= 2^40")
		b.need(m.GetReqSlotsFree() < 1<<31 && m.GetMetadataSlotsFree() < 1<<31 && m.GetQueueDepth() < 1<<31 && m.GetRunning() < 1<<31, "counts < 2^31")
	}, &ReportCapacityRequest{DecodeDpRank: 1, TokensFree: 4096, PagesFree: 64, ReqSlotsFree: 8, QueueDepth: 2, Running: 3})
}

func FuzzResync(f *testing.F) {
	fuzzValidate(f, func() *ResyncRequest { return new(ResyncRequest) }, func(b *bounds, m *ResyncRequest) {
		b.need(len(m.GetRooms()) <= 4096, "rooms <= 4,096")
		for _, r := range m.GetRooms() {
			b.need(roomOK(r.GetRoom()), "rooms[i].room")
			b.need(len(r.GetRid()) >= 1 && len(r.GetRid()) <= 512, "rooms[i].rid 1..512 bytes")
			b.need(r.GetPromptLen() >= 1 && r.GetPromptLen() <= 1<<24, "rooms[i].prompt_len 1..2^24")
			b.need(r.GetMaxNewTokens() >= 1 && r.GetMaxNewTokens() <= 1<<24, "rooms[i].max_new_tokens 1..2^24")
			b.need(r.GetDecodeDpRank() < 1024, "rooms[i].decode_dp_rank < 1024")
			b.need(len(r.GetPageIndices()) >= 1 && len(r.GetPageIndices()) <= 1<<24, "rooms[i].page_indices 1..2^24 entries")
			for _, p := range r.GetPageIndices() {
				b.need(p >= 0, "rooms[i].page_indices[j] >= 0")
			}
			if r.GetInFlight() {
				b.need(r.GetMetadataSlot() >= 0, "rooms[i].metadata_slot >= 0")
				b.need(len(r.GetState()) <= 4, "rooms[i].state <= 4 entries")
				b.need(r.GetDecodePrefixLen() <= 1<<24, "rooms[i].decode_prefix_len <= 2^24")
			} else {
				b.need(r.GetReqSlot() >= 1, "rooms[i].req_slot >= 1")
				b.need(r.GetOutputLen() <= 1<<24, "rooms[i].output_len <= 2^24")
			}
		}
	}, &ResyncRequest{Rooms: []*ResyncRoom{{Room: 5, Rid: "r", PromptLen: 100, MaxNewTokens: 8, ReqSlot: 1, PageIndices: []int32{1, 2}}}, Done: true},
		&ResyncRequest{Rooms: []*ResyncRoom{{Room: 6, Rid: "r", PromptLen: 100, MaxNewTokens: 8, InFlight: true, PageIndices: []int32{1, 2}, MetadataSlot: 3}}})
}

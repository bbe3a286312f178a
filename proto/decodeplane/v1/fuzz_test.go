package decodeplanev1

import (
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Fuzz targets for the validation of every decodeplane.v1 request message:
// random bytes → proto.Unmarshal → Validate() must not panic; every error
// line names a field path; and a message that validates respects the bounds
// the .proto comments document, restated here independently of validate.go.
// Run one with: go test -run '^$' -fuzz '^FuzzOpenRoom$' -fuzztime 60s
// ./proto/decodeplane/v1 (make fuzz runs them all).

type validated interface {
	proto.Message
	Validate() error
}

// fieldLine is how every validation error starts: a field path as in the
// proto, then ": ".
var fieldLine = regexp.MustCompile(`^[a-z_]+(\[\d+\])?(\.[a-z_]+(\[\d+\])?)*: `)

// bounds collects the documented bounds a message breaks.
type bounds []string

func (b *bounds) need(ok bool, what string) {
	if !ok {
		*b = append(*b, what)
	}
}

func fuzzValidate[T validated](f *testing.F, newMsg func() T, check func(*bounds, T), seeds ...T) {
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		m := newMsg()
		if err := proto.Unmarshal(data, m); err != nil {
			return // the server's codec refuses it (server/grpcdecode)
		}
		err := m.Validate()
		if err != nil {
			for _, line := range strings.Split(err.Error(), "\n") {
				if !fieldLine.MatchString(line) {
					t.Fatalf("%T: error line %q does not start with a field path", m, line)
				}
			}
			return
		}
		var b bounds
		check(&b, m)
		if len(b) > 0 {
			t.Fatalf("%T validated but breaks its documented bounds %q: %v", m, b, m)
		}
	})
}

// hostPort restates the "host:port" bound: at most 261 bytes, a host
// without spaces or control characters, a decimal port 1..65535.
func hostPort(s string) bool {
	if len(s) > 261 {
		return false
	}
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" || strings.ContainsAny(h, " \t\r\n\v\f\x00") {
		return false
	}
	if p == "" || strings.Trim(p, "0123456789") != "" {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n >= 1 && n <= 65535
}

func roomOK(r uint64) bool { return r >= 1 && r < 1<<63 }

func rankOK(b *bounds, r *PrefillRank) {
	b.need(r != nil, "rank required")
	b.need(hostPort(r.GetBootstrapAddr()), "rank.bootstrap_addr host:port")
	b.need(r.GetDpRank() < 1024 && r.GetCpRank() < 1024 && r.GetTpRank() < 1024 && r.GetPpRank() < 1024, "rank.*_rank < 1024")
}

func chunkOK(b *bounds, index, offset, pages uint32) {
	b.need(index < 1<<24, "chunk_index < 2^24")
	b.need(pages <= 1<<24 && uint64(offset)+uint64(pages) <= 1<<24, "page_offset + num_pages <= 2^24")
}

var seedRank = &PrefillRank{BootstrapAddr: "10.0.0.1:8998"}

func FuzzRegisterPrefill(f *testing.F) {
	fuzzValidate(f, func() *RegisterPrefillRequest { return new(RegisterPrefillRequest) }, func(b *bounds, m *RegisterPrefillRequest) {
		b.need(hostPort(m.GetBootstrapAddr()), "bootstrap_addr")
		b.need(hostPort(m.GetRankEndpoint()), "rank_endpoint")
		p := m.GetParallel()
		b.need(p != nil, "parallel required")
		for _, s := range []uint32{p.GetAttnTpSize(), p.GetPpSize()} {
			b.need(s >= 1 && s <= 1024, "attn_tp_size, pp_size in 1..1024")
		}
		for _, s := range []uint32{p.GetAttnCpSize(), p.GetAttnDpSize(), p.GetSystemDpSize()} {
			b.need(s <= 1024, "attn_cp/attn_dp/system_dp size <= 1024")
		}
		b.need(p.GetAttnTpRank() < p.GetAttnTpSize() && p.GetPpRank() < p.GetPpSize(), "ranks below sizes")
		b.need(p.GetAttnCpRank() < max(p.GetAttnCpSize(), 1) && p.GetAttnDpRank() < max(p.GetAttnDpSize(), 1) && p.GetSystemDpRank() < max(p.GetSystemDpSize(), 1), "ranks below sizes (0 = 1)")
		dp := max(p.GetAttnDpSize(), 1)
		if p.GetSystemDpSize() > 1 {
			dp = p.GetSystemDpSize()
		}
		b.need(uint64(dp)*uint64(max(p.GetAttnCpSize(), 1))*uint64(p.GetAttnTpSize())*uint64(p.GetPpSize()) <= 65536, "instance ranks <= 65536")
		ps := m.GetPageSize()
		b.need(ps >= 1 && ps <= 65536 && ps&(ps-1) == 0, "page_size a power of two <= 65536")
		b.need(len(m.GetKvCacheDtype()) >= 1 && len(m.GetKvCacheDtype()) <= 32, "kv_cache_dtype 1..32 bytes")
		b.need(m.GetLoadBalanceMethod() == "" || strings.Contains(" follow_bootstrap_room round_robin shortest_queue minimum_tokens total_requests total_tokens auto ", " "+m.GetLoadBalanceMethod()+" "), "load_balance_method enumerated")
		b.need(m.GetPrefillHttpPort() <= 65535, "prefill_http_port <= 65535")
		b.need(len(m.GetInstanceId()) <= 256, "instance_id <= 256 bytes")
		mf := m.GetModel()
		b.need(len(mf.GetKvPoolKind()) <= 32 && mf.GetNumLayers() <= 4096 && mf.GetTotalKvHeads() <= 4096 && mf.GetHeadDim() <= 16384 && mf.GetKvLoraRank() <= 16384 && mf.GetQkRopeHeadDim() <= 16384, "model facts bounded")
	},
		&RegisterPrefillRequest{BootstrapAddr: "10.0.0.1:8998", RankEndpoint: "10.0.0.1:9000", Parallel: &ParallelInfo{AttnTpSize: 2, AttnTpRank: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 16, KvCacheDtype: "bf16",
			LoadBalanceMethod: "follow_bootstrap_room", Model: &ModelFacts{KvPoolKind: "gqa", NumLayers: 32, TotalKvHeads: 8, HeadDim: 128}},
		&RegisterPrefillRequest{BootstrapAddr: "10.0.8.2:8998", RankEndpoint: "10.9.0.1:9000", Parallel: &ParallelInfo{AttnTpSize: 1024, AttnDpSize: 64, PpSize: 1, SystemDpSize: 2}, PageSize: 64, KvCacheDtype: "fp8_e4m3", InstanceId: "i-1"},
		&RegisterPrefillRequest{BootstrapAddr: "nohost", Parallel: &ParallelInfo{AttnTpSize: 1 << 31, PpSize: 1<<32 - 1}, PageSize: 48},
	)
}

func FuzzHeartbeat(f *testing.F) {
	fuzzValidate(f, func() *HeartbeatRequest { return new(HeartbeatRequest) }, func(b *bounds, m *HeartbeatRequest) {
		rankOK(b, m.GetRank())
		b.need(len(m.GetInstanceId()) <= 256, "instance_id")
	}, &HeartbeatRequest{Rank: seedRank, InstanceId: "i-1"}, &HeartbeatRequest{})
}

func FuzzBindRoom(f *testing.F) {
	fuzzValidate(f, func() *BindRoomRequest { return new(BindRoomRequest) }, func(b *bounds, m *BindRoomRequest) {
		b.need(hostPort(m.GetBootstrapAddr()), "bootstrap_addr")
		b.need(roomOK(m.GetRoom()), "room")
		b.need(m.GetDpRank() < 1024, "dp_rank")
	}, &BindRoomRequest{BootstrapAddr: "10.0.0.1:8998", Room: 10, DpRank: 2}, &BindRoomRequest{Room: 1 << 63})
}

func FuzzLookupDPRanks(f *testing.F) {
	fuzzValidate(f, func() *LookupDPRanksRequest { return new(LookupDPRanksRequest) }, func(b *bounds, m *LookupDPRanksRequest) {
		b.need(hostPort(m.GetBootstrapAddr()), "bootstrap_addr")
		b.need(len(m.GetRooms()) <= 100000 && len(m.GetHints()) <= 100000, "at most 100,000 rooms and hints")
		for _, r := range m.GetRooms() {
			b.need(roomOK(r), "rooms[i]")
		}
		for _, h := range m.GetHints() {
			b.need(roomOK(h.GetRoom()) && h.GetDpRank() < 1024, "hints[i]")
		}
	}, &LookupDPRanksRequest{BootstrapAddr: "10.0.0.1:8998", Rooms: []uint64{1, 2, 3}, Hints: []*RoomHint{{Room: 4, DpRank: 1}}})
}

func FuzzOpenRoom(f *testing.F) {
	fuzzValidate(f, func() *OpenRoomRequest { return new(OpenRoomRequest) }, func(b *bounds, m *OpenRoomRequest) {
		b.need(len(m.GetRid()) >= 1 && len(m.GetRid()) <= 512, "rid 1..512 bytes")
		b.need(hostPort(m.GetBootstrapAddr()), "bootstrap_addr")
		b.need(roomOK(m.GetRoom()), "room")
		b.need(m.GetPromptLen() >= 1 && m.GetPromptLen() <= 1<<24, "prompt_len 1..2^24")
		b.need(m.GetOutputLen() <= 1<<24, "output_len <= 2^24")
		b.need(m.GetMaxNewTokens() >= 1 && m.GetMaxNewTokens() <= 1<<24, "max_new_tokens 1..2^24")
		b.need(uint64(m.GetPromptLen())+uint64(m.GetOutputLen())+uint64(m.GetMaxNewTokens()) < 1<<32, "the sum fits in uint32")
		b.need(m.GetPriority() >= -1<<20 && m.GetPriority() <= 1<<20, "priority")
		b.need(m.GetPrefillDpRank() < 1024 && m.GetDecodeDpRank() < 1024, "dp ranks")
		b.need(len(m.GetIdempotencyKey()) <= 256, "idempotency_key")
		if d := m.GetTimeout(); d != nil {
			// A valid duration (seconds and nanos of one sign, nanos below a
			// second) from 1 ms to 24 h.
			s, n := d.GetSeconds(), int64(d.GetNanos())
			b.need(n > -1e9 && n < 1e9 && (s == 0 || n == 0 || (s > 0) == (n > 0)), "timeout a valid duration")
			b.need(s*1e9+n >= 1e6 && s*1e9+n <= 86400e9, "timeout 1ms..24h")
		}
	}, &OpenRoomRequest{Rid: "r1", BootstrapAddr: "10.0.0.1:8998", Room: 5, PromptLen: 300, MaxNewTokens: 4, IdempotencyKey: "k"},
		&OpenRoomRequest{Rid: "r2", BootstrapAddr: "10.0.0.1:8998", Room: 6, PromptLen: 300, OutputLen: 2000000, MaxNewTokens: 1<<32 - 1, Rebootstrap: true},
		&OpenRoomRequest{Rid: "r3", BootstrapAddr: "10.0.0.1:8998", Room: 7, PromptLen: 300, MaxNewTokens: 4, Timeout: durationpb.New(2 * time.Second)},
		&OpenRoomRequest{Rid: "r4", BootstrapAddr: "10.0.0.1:8998", Room: 8, PromptLen: 300, MaxNewTokens: 4, Timeout: &durationpb.Duration{Nanos: 999999}})
}

func FuzzAwaitDestination(f *testing.F) {
	fuzzValidate(f, func() *AwaitDestinationRequest { return new(AwaitDestinationRequest) }, func(b *bounds, m *AwaitDestinationRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
	}, &AwaitDestinationRequest{Room: 5, Rank: seedRank}, &AwaitDestinationRequest{Rank: seedRank})
}

func auxOK(b *bounds, a *Aux, last bool) {
	if last {
		b.need(a != nil && a.GetRoomMarker() != 0, "aux.room_marker on the last chunk")
	} else {
		b.need(a.GetRoomMarker() == 0 && len(a.GetOutputIds()) == 0, "no aux before the last chunk")
	}
	b.need(len(a.GetOutputIds()) <= 14, "aux.output_ids <= 14")
}

func FuzzTransfer(f *testing.F) {
	fuzzValidate(f, func() *TransferRequest { return new(TransferRequest) }, func(b *bounds, m *TransferRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
		chunkOK(b, m.GetChunkIndex(), m.GetPageOffset(), m.GetNumPages())
		b.need(m.GetNumPages() > 0 || m.GetLast(), "num_pages > 0 unless last")
		src := m.GetSource()
		b.need(len(src.GetBuffer()) <= 256, "source.buffer")
		b.need(len(src.GetPageIndices()) == 0 || len(src.GetPageIndices()) == int(m.GetNumPages()), "source.page_indices count")
		for _, p := range src.GetPageIndices() {
			b.need(p >= 0, "source.page_indices >= 0")
		}
		auxOK(b, m.GetAux(), m.GetLast())
		b.need(m.GetAttempt() <= 1<<20, "attempt")
		b.need(src == nil || src.AuxRow == nil || (m.GetLast() && src.GetAuxRow() < 1<<24), "source.aux_row on the last chunk, < 2^24")
		b.need(len(src.GetState()) == 0 || (m.GetLast() && len(src.GetState()) <= 4), "source.state on the last chunk, <= 4 entries")
		seen := map[StateType]bool{}
		for _, s := range src.GetState() {
			b.need(s.GetType() >= StateType_STATE_TYPE_MAMBA && s.GetType() <= StateType_STATE_TYPE_DSA && !seen[s.GetType()], "source.state[i].type defined, once")
			seen[s.GetType()] = true
			for _, v := range s.GetIndices() {
				b.need(v >= 0, "source.state[i].indices >= 0")
			}
		}
	}, &TransferRequest{Room: 5, Rank: seedRank, NumPages: 2, Last: true, Source: &TransferSource{Buffer: "p/kv", PageIndices: []int32{3, 4}}, Aux: &Aux{RoomMarker: 5, OutputIds: []int32{1}}},
		&TransferRequest{Room: 5, Rank: seedRank, NumPages: 1, Last: true, Source: &TransferSource{Buffer: "p", PageIndices: []int32{3}, AuxRow: proto.Uint32(7),
			State: []*StateIndices{{Type: StateType_STATE_TYPE_MAMBA, Indices: []int32{2}}}}, Aux: &Aux{RoomMarker: 5}},
		&TransferRequest{Room: 5, Rank: seedRank, ChunkIndex: 1, PageOffset: 2, NumPages: 2, Attempt: 1})
}

func FuzzReportTransfer(f *testing.F) {
	fuzzValidate(f, func() *ReportTransferRequest { return new(ReportTransferRequest) }, func(b *bounds, m *ReportTransferRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
		chunkOK(b, m.GetChunkIndex(), m.GetPageOffset(), m.GetNumPages())
		b.need(!m.GetSuccess() || m.GetLast() || m.GetNumPages() > 0, "num_pages")
		b.need(len(m.GetFailureReason()) <= 4096 && (!m.GetSuccess() || m.GetFailureReason() == ""), "failure_reason")
		b.need(m.GetBytes() <= 1<<50, "bytes <= 2^50")
		b.need(!(m.GetSuccess() && m.GetLast()) || m.GetMetadataRoomMarker() != 0, "metadata_room_marker on a successful last chunk")
		b.need(m.GetLast() || m.GetMetadataRoomMarker() == 0, "no marker before the last chunk")
		b.need(m.GetAttempt() <= 1<<20, "attempt")
	}, &ReportTransferRequest{Room: 5, Rank: seedRank, NumPages: 2, Last: true, Success: true, Bytes: 1 << 20, MetadataRoomMarker: 5},
		&ReportTransferRequest{Room: 5, Rank: seedRank, FailureReason: "rdma error"}, &ReportTransferRequest{Room: 5, Rank: seedRank, Bytes: 1 << 63, Success: true, NumPages: 1})
}

func FuzzAckRoomEnd(f *testing.F) {
	fuzzValidate(f, func() *AckRoomEndRequest { return new(AckRoomEndRequest) }, func(b *bounds, m *AckRoomEndRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
		b.need(m.GetAttempt() >= 1, "attempt >= 1")
	}, &AckRoomEndRequest{Room: 5, Rank: seedRank, Attempt: 1}, &AckRoomEndRequest{Room: 5, Rank: seedRank, Attempt: 1 << 31})
}

func FuzzRoomByID(f *testing.F) {
	// WatchRoom, GetRoom and ReleaseRoom name only a room.
	for _, seed := range []uint64{1, 5, 1<<63 - 1, 0, 1 << 63} {
		b, _ := proto.Marshal(&GetRoomRequest{Room: seed, IncludePages: true})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []validated{new(WatchRoomRequest), new(GetRoomRequest), new(ReleaseRoomRequest)} {
			if proto.Unmarshal(data, m) != nil {
				continue
			}
			var room uint64
			switch m := m.(type) {
			case *WatchRoomRequest:
				room = m.GetRoom()
			case *GetRoomRequest:
				room = m.GetRoom()
			case *ReleaseRoomRequest:
				room = m.GetRoom()
			}
			if err := m.Validate(); (err == nil) != roomOK(room) {
				t.Fatalf("%T{room: %d}: Validate() = %v; want an error exactly when room is outside 1..2^63-1", m, room, err)
			} else if err != nil && !fieldLine.MatchString(err.Error()) {
				t.Fatalf("%T: error %q does not start with a field path", m, err)
			}
		}
	})
}

func FuzzAbortRoom(f *testing.F) {
	fuzzValidate(f, func() *AbortRoomRequest { return new(AbortRoomRequest) }, func(b *bounds, m *AbortRoomRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		b.need(len(m.GetReason()) <= 4096, "reason")
	}, &AbortRoomRequest{Room: 5, Reason: "client went away"})
}

func FuzzListRooms(f *testing.F) {
	fuzzValidate(f, func() *ListRoomsRequest { return new(ListRoomsRequest) }, func(b *bounds, m *ListRoomsRequest) {
		b.need(m.GetLimit() <= 100000, "limit")
		b.need(len(m.GetPhases()) <= 16, "phases <= 16")
		for _, p := range m.GetPhases() {
			b.need(p >= RoomPhase_ROOM_PHASE_WAITING_PREFILL && p <= RoomPhase_ROOM_PHASE_HELD, "phases defined")
		}
		b.need(m.GetBootstrapAddr() == "" || hostPort(m.GetBootstrapAddr()), "bootstrap_addr")
	}, &ListRoomsRequest{Phases: []RoomPhase{RoomPhase_ROOM_PHASE_QUEUED}, BootstrapAddr: "10.0.0.1:8998", Limit: 10, LiveOnly: true})
}

func FuzzReportRunning(f *testing.F) {
	fuzzValidate(f, func() *ReportRunningRequest { return new(ReportRunningRequest) }, func(b *bounds, m *ReportRunningRequest) {
		b.need(len(m.GetRooms()) <= 100000, "rooms <= 100,000")
		for _, u := range m.GetRooms() {
			b.need(roomOK(u.GetRoom()) && u.GetOutputLen() <= 1<<24, "rooms[i]")
		}
	}, &ReportRunningRequest{Rooms: []*RunningUsage{{Room: 5, OutputLen: 100}, {Room: 6, OutputLen: 7}}})
}

func FuzzRetractRoom(f *testing.F) {
	fuzzValidate(f, func() *RetractRoomRequest { return new(RetractRoomRequest) }, func(b *bounds, m *RetractRoomRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		b.need(m.GetMode() == RetractMode_RETRACT_MODE_RETRACT || m.GetMode() == RetractMode_RETRACT_MODE_REBOOTSTRAP, "mode")
	}, &RetractRoomRequest{Room: 5, Mode: RetractMode_RETRACT_MODE_REBOOTSTRAP})
}

func FuzzSetupStaging(f *testing.F) {
	fuzzValidate(f, func() *SetupStagingRequest { return new(SetupStagingRequest) }, func(b *bounds, m *SetupStagingRequest) {
		rankOK(b, m.GetRank())
	}, &SetupStagingRequest{Rank: &PrefillRank{BootstrapAddr: "p4:1", TpRank: 3}})
}

func FuzzAllocateStaging(f *testing.F) {
	fuzzValidate(f, func() *AllocateStagingRequest { return new(AllocateStagingRequest) }, func(b *bounds, m *AllocateStagingRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
		b.need(m.GetChunkIndex() < 1<<24, "chunk_index")
		b.need(m.GetNumPages() >= 1 && m.GetNumPages() <= 1<<24, "num_pages")
	}, &AllocateStagingRequest{Room: 5, Rank: seedRank, ChunkIndex: 1, NumPages: 40})
}

func FuzzChunkReady(f *testing.F) {
	fuzzValidate(f, func() *ChunkReadyRequest { return new(ChunkReadyRequest) }, func(b *bounds, m *ChunkReadyRequest) {
		b.need(roomOK(m.GetRoom()), "room")
		rankOK(b, m.GetRank())
		chunkOK(b, m.GetChunkIndex(), m.GetPageOffset(), m.GetNumPages())
		b.need(m.GetNumPages() >= 1, "num_pages >= 1")
		auxOK(b, m.GetAux(), m.GetLast())
	}, &ChunkReadyRequest{Room: 5, Rank: seedRank, ChunkIndex: 1, PageOffset: 40, NumPages: 40, Last: true, Aux: &Aux{RoomMarker: 5, OutputIds: []int32{1, 2}}},
		&ChunkReadyRequest{Room: 5, Rank: seedRank, NumPages: 1})
}

func FuzzWatchWatermark(f *testing.F) {
	fuzzValidate(f, func() *WatchWatermarkRequest { return new(WatchWatermarkRequest) }, func(b *bounds, m *WatchWatermarkRequest) {
		b.need(m.GetDecodeDpRank() < 1024, "decode_dp_rank")
		b.need(len(m.GetDecodeTpRanks()) <= 1024, "decode_tp_ranks <= 1024")
		for _, tp := range m.GetDecodeTpRanks() {
			b.need(tp < 1024, "decode_tp_ranks[i]")
		}
	}, &WatchWatermarkRequest{DecodeTpRanks: []uint32{0, 3}})
}

func FuzzWatchCapacity(f *testing.F) {
	fuzzValidate(f, func() *WatchCapacityRequest { return new(WatchCapacityRequest) }, func(b *bounds, m *WatchCapacityRequest) {
		// Restated from capacity.proto: unset or 0 is the default; else
		// min_interval 10ms..60s, keepalive_interval 1s..10m and not below
		// min_interval.
		get := func(d *durationpb.Duration, def time.Duration) time.Duration {
			if d.GetSeconds() == 0 && d.GetNanos() == 0 {
				return def
			}
			return time.Duration(d.GetSeconds())*time.Second + time.Duration(d.GetNanos())
		}
		minI, keep := get(m.GetMinInterval(), 100*time.Millisecond), get(m.GetKeepaliveInterval(), 10*time.Second)
		b.need(minI >= 10*time.Millisecond && minI <= time.Minute, "min_interval 10ms..60s")
		b.need(keep >= time.Second && keep <= 10*time.Minute, "keepalive_interval 1s..10m")
		b.need(keep >= minI, "keepalive_interval >= min_interval")
		if gotMin, gotKeep := m.Intervals(); gotMin != minI || gotKeep != keep {
			b.need(false, "Intervals() returns the validated values")
		}
	}, &WatchCapacityRequest{}, &WatchCapacityRequest{MinInterval: durationpb.New(time.Second), KeepaliveInterval: durationpb.New(time.Second)},
		&WatchCapacityRequest{MinInterval: durationpb.New(time.Second), KeepaliveInterval: durationpb.New(500 * time.Millisecond)})
}

func FuzzPrefillHello(f *testing.F) {
	fuzzValidate(f, func() *PrefillHello { return new(PrefillHello) }, func(b *bounds, m *PrefillHello) {
		rankOK(b, m.GetRank())
		b.need(len(m.GetInstanceId()) <= 256, "instance_id")
	}, &PrefillHello{Rank: seedRank, InstanceId: "i-1", Incarnation: 7}, &PrefillHello{})
}

// envelope is a PrefillRequest's envelope checks as a Validate method, for
// fuzzValidate (PrefillRequest has no Validate on purpose).
type envelope struct{ *PrefillRequest }

func (e envelope) Validate() error { return e.CheckEnvelope() }

func FuzzPrefillRequestEnvelope(f *testing.F) {
	fuzzValidate(f, func() envelope { return envelope{new(PrefillRequest)} }, func(b *bounds, m envelope) {
		b.need(m.GetSeq() < 1<<63, "seq")
		b.need(len(m.GetTraceparent()) <= 128, "traceparent")
		b.need(len(m.GetTracestate()) <= 512, "tracestate")
	}, envelope{&PrefillRequest{Seq: 3, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}, envelope{&PrefillRequest{Seq: 1 << 63}})
}

package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func ts(d time.Duration) *timestamppb.Timestamp { return timestamppb.New(t0.Add(d)) }

func TestHumanDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0ms"},
		{850 * time.Millisecond, "850ms"},
		{4200 * time.Millisecond, "4.2s"},
		{42 * time.Second, "42s"},
		{3*time.Minute + 7*time.Second, "3m07s"},
		{5*time.Hour + 2*time.Minute + 59*time.Second, "5h02m"},
		{76 * time.Hour, "3d04h"},
	} {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%s) = %q; want %q", tt.d, got, tt.want)
		}
	}
}

func TestSmallFormatters(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{humanBytes(0), "0 B"},
		{humanBytes(1023), "1023 B"},
		{humanBytes(1536), "1.5 KiB"},
		{humanBytes(131072000), "125.0 MiB"},
		{humanBytes(3 << 30), "3.0 GiB"},
		{percent(20, 16384), "0.1%"},
		{percent(1, 3), "33.3%"},
		{percent(1, 0), "-"},
		{truncate("short", 10), "short"},
		{truncate("a rather long failure message", 10), "a rather …"},
		{formatPages(nil), ""},
		{formatPages([]int32{7}), "7"},
		{formatPages([]int32{3, 4, 5, 6, 1, 9, 10}), "3-6,1,9-10"},
		{formatPages([]int32{5, 4, 3}), "5,4,3"},
		{offset(ts(1204*time.Millisecond), ts(0)), "+1.204s"},
		{offset(ts(0), ts(0)), "+0.000s"},
		{offset(nil, ts(0)), "-"},
		{age(ts(0), t0.Add(90*time.Second)), "1m30s"},
		{age(timestamppb.New(time.Time{}), t0), "-"},
		{phaseName(pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK), "resolving_dp_rank"},
		{pollName(pb.KVPoll_KV_POLL_WAITING_FOR_INPUT), "WaitingForInput"},
		{ruleName(pb.DPRankRule_DP_RANK_RULE_FOLLOW_ROOM), "follow_room"},
		{ruleName(pb.DPRankRule_DP_RANK_RULE_UNSPECIFIED), "-"},
		{failureName(pb.FailureCode_FAILURE_CODE_WAITING_TIMEOUT), "waiting_timeout"},
		{formatRoomsByPhase(nil), "none"},
		{formatRoomsByPhase(map[string]uint32{"failed": 2, "queued": 1, "zombie": 1, "held": 0}), "4 total: queued 1, failed 2, zombie 1"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q; want %q", tt.got, tt.want)
		}
	}
}

func TestParsePhases(t *testing.T) {
	got, err := parsePhases("succeeded, FAILED,resolving-dp-rank,ROOM_PHASE_HELD,")
	want := []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_SUCCEEDED, pb.RoomPhase_ROOM_PHASE_FAILED, pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK, pb.RoomPhase_ROOM_PHASE_HELD}
	if err != nil || !cmp.Equal(got, want) {
		t.Errorf("parsePhases = %v, %v; want %v", got, err, want)
	}
	if got, err := parsePhases(""); err != nil || got != nil {
		t.Errorf("parsePhases(\"\") = %v, %v; want none", got, err)
	}
	if _, err := parsePhases("unspecified"); err == nil {
		t.Error("parsePhases accepted unspecified")
	}
	if n := len(phaseNames()); n != len(pb.RoomPhase_name)-1 {
		t.Errorf("phaseNames lists %d phases; the API has %d", n, len(pb.RoomPhase_name)-1)
	}
}

func TestFindCommand(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want int
	}{
		{nil, -1},
		{[]string{"rooms"}, 0},
		{[]string{"--addr", "x", "rooms"}, 2},
		{[]string{"--addr=x", "rooms"}, 1},
		{[]string{"-o", "json", "--live", "rooms"}, 3},
		{[]string{"--phase", "failed", "rooms"}, 2},
		{[]string{"-w", "rooms"}, 1},
		{[]string{"--tls", "status"}, 1},
		{[]string{"--", "status"}, 1},
		{[]string{"--addr", "x"}, -1},
	} {
		if got := findCommand(tt.args); got != tt.want {
			t.Errorf("findCommand(%q) = %d; want %d", tt.args, got, tt.want)
		}
	}
}

// sampleRooms are one succeeded room and one failed room.
func sampleRooms() []*pb.Room {
	return []*pb.Room{
		{
			Room: 42, Rid: "req-42", BootstrapAddr: "10.0.0.1:8998", PrefillDpRank: proto.Uint32(1), DpRankRule: pb.DPRankRule_DP_RANK_RULE_FOLLOW_ROOM,
			Phase: pb.RoomPhase_ROOM_PHASE_SUCCEEDED, Poll: pb.KVPoll_KV_POLL_SUCCESS, NumPages: 16, MetadataSlot: 3,
			PromptLen: 1000, MaxNewTokens: 128, ChunksDone: 4, BytesTransferred: 2 << 20,
			OpenedAt: ts(0), UpdatedAt: ts(1204 * time.Millisecond), Attempt: 1,
			PageIndices: []int32{0, 1, 2, 3, 8, 9},
			Coverage: []*pb.RankCoverage{
				{TpRank: 0, Claimed: true, PagesLanded: 16, PagesRequired: 16, LastLanded: true, Bytes: 1 << 20},
				{TpRank: 1, Claimed: true, PagesLanded: 12, PagesRequired: 16, Bytes: 768 << 10},
			},
			WaitingFor: "ReleaseRoom from the decode engine (it owns the pages until then)",
			Transitions: []*pb.Transition{
				{Phase: pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, Poll: pb.KVPoll_KV_POLL_BOOTSTRAPPING, At: ts(0), Sglang: "T1", Note: "opened on decode shard 0", Attempt: 1},
				{Phase: pb.RoomPhase_ROOM_PHASE_QUEUED, Poll: pb.KVPoll_KV_POLL_WAITING_FOR_INPUT, At: ts(2 * time.Millisecond), Sglang: "T2/T4/T8", Note: "prefill dp rank 1 (follow_room)", Attempt: 1},
				{Phase: pb.RoomPhase_ROOM_PHASE_TRANSFERRING, Poll: pb.KVPoll_KV_POLL_TRANSFERRING, At: ts(900 * time.Millisecond), Note: "chunk 0 landed", Attempt: 1},
				{Phase: pb.RoomPhase_ROOM_PHASE_SUCCEEDED, Poll: pb.KVPoll_KV_POLL_SUCCESS, At: ts(1204 * time.Millisecond), Sglang: "T12/T17", Note: "4 chunks", Attempt: 1},
			},
		},
		{
			Room: 7, Rid: "req-7", BootstrapAddr: "10.0.0.2:8998",
			Phase: pb.RoomPhase_ROOM_PHASE_FAILED, Poll: pb.KVPoll_KV_POLL_FAILED, MetadataSlot: -1,
			Failure:  &pb.Failure{Code: pb.FailureCode_FAILURE_CODE_PREFILL_LOST, Message: "Lost connection with prefill instance (bootstrap_addr: 10.0.0.2:8998), 3 requests affected"},
			OpenedAt: ts(-75 * time.Second), UpdatedAt: ts(-5 * time.Second), Attempt: 1,
		},
	}
}

func TestWriteRoomList(t *testing.T) {
	var b bytes.Buffer
	if err := writeRoomList(&b, &pb.ListRoomsResponse{Rooms: sampleRooms(), Total: 9}, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	want := `ROOM  RID     STATE      KVPOLL   AGE    PREFILL            PAGES  FAILURE
42    req-42  succeeded  Success  3.0s   10.0.0.1:8998/dp1  16
7     req-7   failed     Failed   1m18s  10.0.0.2:8998      0      prefill_lost: Lost connection with prefill instance (bootst…
showing 2 of 9 rooms
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("rooms table (-want +got):\n%s", diff)
	}
}

func TestWriteRoom(t *testing.T) {
	var b bytes.Buffer
	if err := writeRoom(&b, sampleRooms()[0], true, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	// The timestamps are in the local zone: compare the rest.
	for _, want := range []string{
		"Room:          42\n",
		"State:         succeeded (KVPoll Success)\n",
		"Prefill:       10.0.0.1:8998, dp rank 1 (follow_room)\n",
		"Decode:        dp shard 0, metadata slot 3\n",
		"Request:       prompt 1000 tokens, max new tokens 128, priority 0\n",
		"Page indices:  0-3,8-9\n",
		"Transferred:   4 chunks, 2.0 MiB\n",
		"Coverage:      prefill cp 0 tp 0 pp 0: 16/16 pages landed, 1.0 MiB, last chunk landed\n",
		"Coverage:      prefill cp 0 tp 1 pp 0: 12/16 pages landed, 768.0 KiB\n",
		"Waiting for:   ReleaseRoom from the decode engine (it owns the pages until then)\n",
		" (3.0s ago)\n",
		" (+1.204s after opening)\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("room output lacks %q:\n%s", want, got)
		}
	}
	_, tl, _ := strings.Cut(got, "\nTimeline:\n")
	want := `  OFFSET   PHASE            KVPOLL           SGLANG    NOTE
  +0.000s  waiting_prefill  Bootstrapping    T1        opened on decode shard 0
  +0.002s  queued           WaitingForInput  T2/T4/T8  prefill dp rank 1 (follow_room)
  +0.900s  transferring     Transferring     -         chunk 0 landed
  +1.204s  succeeded        Success          T12/T17   4 chunks
`
	if diff := cmp.Diff(want, tl); diff != "" {
		t.Errorf("timeline (-want +got):\n%s", diff)
	}

	// A room with the request's budget: its deadline and the time each
	// phase took.
	b.Reset()
	budgeted := sampleRooms()[1]
	budgeted.Failure = &pb.Failure{Code: pb.FailureCode_FAILURE_CODE_DEADLINE_EXCEEDED, Message: "Request 7 exceeded its deadline (timeout 2s from OpenRoom) in KVPoll.WaitingForInput, phase admitted"}
	budgeted.Timeout, budgeted.Deadline = durationpb.New(2*time.Second), ts(-73*time.Second)
	budgeted.PhaseTimes = []*pb.PhaseTime{
		{Phase: pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, Spent: durationpb.New(0)},
		{Phase: pb.RoomPhase_ROOM_PHASE_QUEUED, Spent: durationpb.New(12 * time.Millisecond)},
		{Phase: pb.RoomPhase_ROOM_PHASE_ADMITTED, Spent: durationpb.New(1988 * time.Millisecond)},
	}
	if err := writeRoom(&b, budgeted, false, t0); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		" (timeout 2s from opening; it bounds the first attempt's hand-off)\n",
		"Phase times:  waiting_prefill 0s, queued 12ms, admitted 1.988s (2s in all, of a 2s budget)\n",
		"Failure:      deadline_exceeded: Request 7 exceeded its deadline (timeout 2s from OpenRoom) in KVPoll.WaitingForInput, phase admitted\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("room output lacks %q:\n%s", want, b.String())
		}
	}

	b.Reset()
	failed := sampleRooms()[1]
	failed.Failure.FromAnotherRank = true
	if err := writeRoom(&b, failed, false, t0); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Prefill:      10.0.0.2:8998, dp rank unresolved\n",
		"Decode:       dp shard 0\n",
		"Failure:      prefill_lost: Lost connection with prefill instance (bootstrap_addr: 10.0.0.2:8998), 3 requests affected (reported by another prefill rank)\n",
		"\nNo transitions recorded.\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("failed room output lacks %q:\n%s", want, b.String())
		}
	}
}

func TestWriteTimelineAttempts(t *testing.T) {
	r := &pb.Room{OpenedAt: ts(0), Transitions: []*pb.Transition{
		{Phase: pb.RoomPhase_ROOM_PHASE_HELD, Poll: pb.KVPoll_KV_POLL_SUCCESS, At: ts(time.Second), Sglang: "T21", Note: "held", Attempt: 1},
		{Phase: pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL, Poll: pb.KVPoll_KV_POLL_BOOTSTRAPPING, At: ts(2 * time.Second), Sglang: "T22", Note: "rebootstrap attempt 2", Attempt: 2},
	}}
	var b bytes.Buffer
	if err := writeTimeline(&b, r); err != nil {
		t.Fatal(err)
	}
	want := `  OFFSET   PHASE            KVPOLL         SGLANG  ATTEMPT  NOTE
  +1.000s  held             Success        T21     1        held
  +2.000s  waiting_prefill  Bootstrapping  T22     2        rebootstrap attempt 2
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("timeline (-want +got):\n%s", diff)
	}
}

func TestWriteStatusTables(t *testing.T) {
	var b bytes.Buffer
	err := writeShards(&b, []*pb.ShardStatus{
		{DpRank: 0, PagesTotal: 1000, PagesFree: 750, ReqSlotsTotal: 64, ReqSlotsFree: 60, MetadataSlotsTotal: 128, MetadataSlotsFree: 120,
			Waiting: 3, Queued: 2, Admitted: 1, Claimed: 2, Running: 4, Retracted: 1, BlockedBy: "tokens", StateSlotsTotal: 10, StateSlotsFree: 9},
		{DpRank: 1, PagesTotal: 1000, PagesFree: 1000, ReqSlotsTotal: 64, ReqSlotsFree: 64, MetadataSlotsTotal: 128, MetadataSlotsFree: 128, StateSlotsTotal: 10, StateSlotsFree: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `SHARD  PAGES USED        REQ SLOTS  META SLOTS  STATE SLOTS  QUEUE WAIT/READY  ADMITTED/CLAIMED/RUNNING  RETRACTED/HELD  BLOCKED BY
0      250/1000 (25.0%)  4/64       8/128       1/10         3/2               1/2/4                     1/0             tokens
1      0/1000 (0.0%)     0/64       0/128       0/10         0/0               0/0/0                     0/0             -
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("shards (-want +got):\n%s", diff)
	}

	b.Reset()
	err = writePrefills(&b, []*pb.PrefillStatus{
		{BootstrapAddr: "10.0.0.1:8998", RegisteredRanks: 4, ExpectedRanks: 4, AttnTpSize: 2, DpSize: 2, PpSize: 1, LastHeartbeat: ts(-2 * time.Second), ActiveRooms: 12, Liveness: "heartbeat"},
		{BootstrapAddr: "10.0.0.2:8998", RegisteredRanks: 1, ExpectedRanks: 2, AttnTpSize: 2, DpSize: 1, PpSize: 1, AttnCpSize: 2, LastHeartbeat: timestamppb.New(time.Time{}), MissedHeartbeats: 1, Liveness: "heartbeat"},
		// In a fleet: the lease decides; this daemon heard one rank 27 s ago, or none.
		{BootstrapAddr: "10.0.0.3:8998", RegisteredRanks: 1, ExpectedRanks: 1, AttnTpSize: 1, DpSize: 1, PpSize: 1, LastHeartbeat: ts(-27 * time.Second), Liveness: "lease", LeaseId: 0x694d8a0c},
		{BootstrapAddr: "10.0.0.4:8998", RegisteredRanks: 1, ExpectedRanks: 1, AttnTpSize: 1, DpSize: 1, PpSize: 1, Liveness: "lease", LeaseId: 0x694d8a0d},
	}, t0)
	if err != nil {
		t.Fatal(err)
	}
	want = `PREFILL        RANKS  TP/DP/PP   LIVENESS        LAST HEARTBEAT  MISSED  ACTIVE ROOMS
10.0.0.1:8998  4/4    2/2/1      heartbeats      2.0s ago        0       12
10.0.0.2:8998  1/2    2/1/1 cp2  heartbeats      never           1       0
10.0.0.3:8998  1/1    1/1/1      lease 694d8a0c  27s ago here    -       0
10.0.0.4:8998  1/1    1/1/1      lease 694d8a0d  none here       -       0
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("prefills (-want +got):\n%s", diff)
	}

	layout := formatLayout(&pb.KVLayout{Kind: "mla", IsMla: true, NumLayers: 61, HeadDim: 576, KvCacheDtype: "fp8_e4m3", PageSize: 64,
		TotalPages: 4096, TokenBytes: 35136, AttnTpSize: 8, DpSize: 8, PpSize: 1, StagingEnabled: true})
	if want := "mla, 61 layers, latent dim 576, fp8_e4m3, page 64 tokens, 4096 pages per shard, 34.3 KiB per token; tp 8 dp 8 pp 1; staging on"; layout != want {
		t.Errorf("formatLayout = %q; want %q", layout, want)
	}
}

func TestWriteLookupAndAbort(t *testing.T) {
	var b bytes.Buffer
	if err := writeLookup(&b, &pb.LookupDPRanksResponse{Unresolved: []uint64{11, 12}}); err != nil {
		t.Fatal(err)
	}
	if want := "unresolved (no rule applies yet): 11 12\n"; b.String() != want {
		t.Errorf("lookup = %q; want %q", b.String(), want)
	}
	b.Reset()
	if err := writeAbort(&b, &pb.AbortRoomResponse{Room: &pb.Room{Phase: pb.RoomPhase_ROOM_PHASE_RELEASED}, AlreadyTerminal: true}, 5); err != nil {
		t.Fatal(err)
	}
	if want := "room 5 had already ended (released); nothing to abort\n"; b.String() != want {
		t.Errorf("abort = %q; want %q", b.String(), want)
	}
}

func TestIsLoopback(t *testing.T) {
	for target, want := range map[string]bool{
		"127.0.0.1:7600":               true,
		"localhost:7600":               true,
		"[::1]:7600":                   true,
		"unix:///run/decodeplane.sock": true,
		"dns:///127.0.0.1:7600":        true,
		"10.0.0.5:7600":                false,
		"decodeplane.prod:7600":        false,
		"dns:///decodeplane:7600":      false,
	} {
		if got := isLoopback(target); got != want {
			t.Errorf("isLoopback(%q) = %v; want %v", target, got, want)
		}
	}
}

// TestStatusPendingClaims: claims waiting for rooms not opened yet show in
// status when there are any.
func TestStatusPendingClaims(t *testing.T) {
	for _, n := range []uint32{0, 3} {
		var b bytes.Buffer
		if err := writeStatus(&b, &pb.GetStatusResponse{Version: "v", PendingClaims: n}, "SERVING", false, time.Now()); err != nil {
			t.Fatal(err)
		}
		has := strings.Contains(b.String(), "Pending claims:")
		if want := n > 0; has != want || (want && !strings.Contains(b.String(), "Pending claims:  3 (prefill claims waiting for rooms not opened yet)\n")) {
			t.Errorf("status with %d pending claims:\n%s", n, b.String())
		}
	}
}

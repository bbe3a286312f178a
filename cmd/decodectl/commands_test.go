package main

import (
	"encoding/json"
	"fmt"
	"net"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

const (
	prefillA = "10.0.0.1:8998" // TP 1, DP 1: every room resolves by single_dp
	prefillB = "10.0.0.2:8998" // never registered: its rooms wait for it
)

// scenario is a daemon with one room in each interesting state:
//
//	1  succeeded        (KV delivered in 4 chunks; the engine holds its pages)
//	2  released
//	3  failed           (aborted with the client)
//	4  admitted         (destination offered, not claimed yet)
//	5  waiting_prefill  (prefill B never registered)
func scenario(t *testing.T, dc ...daemonConfig) *testDaemon {
	t.Helper()
	d := startDaemon(t, append(dc, daemonConfig{})[0])
	p := d.register(t, prefillRank(prefillA, 1, 0))
	d.succeed(t, p, prefillA, 1, 1000)
	d.succeed(t, p, prefillA, 2, 300)
	if _, err := d.c.Engine().ReleaseRoom(testCtx(t), &pb.ReleaseRoomRequest{Room: 2}); err != nil {
		t.Fatal(err)
	}
	d.open(t, prefillA, 3, 500)
	if _, err := d.c.Engine().AbortRoom(testCtx(t), &pb.AbortRoomRequest{Room: 3}); err != nil {
		t.Fatal(err)
	}
	d.open(t, prefillA, 4, 200)
	d.open(t, prefillB, 5, 200)
	return d
}

// roomRows returns the ROOM column of a rooms table, in order.
func roomRows(out string) []string {
	var ids []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if _, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			ids = append(ids, f[0])
		}
	}
	return ids
}

func TestStatus(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "status")
	for _, want := range []string{
		"Version:        test-1.2.3\n",
		"Ready:          yes (serving)\n",
		"Health:         SERVING\n",
		fmt.Sprintf("Incarnation:    %x (new at every daemon start)\n", d.Incarnation()),
		"Transfer path:  sim\n",
		"KV layout:      gqa, 32 layers, 8 KV heads per rank (8 total) x 128 dim, bf16, page 64 tokens",
		"Rooms:          5 total: waiting_prefill 1, admitted 1, succeeded 1, released 1, failed 1\n",
		"SHARD  PAGES USED       REQ SLOTS  META SLOTS  QUEUE WAIT/READY  ADMITTED/CLAIMED/RUNNING  BLOCKED BY\n",
		"PREFILL        RANKS  TP/DP/PP  LIVENESS    LAST HEARTBEAT  MISSED  ACTIVE ROOMS\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "KEY") {
		t.Errorf("status without --config prints the configuration:\n%s", out)
	}
	// Rooms 1 (16 pages) and 4 (4 pages) hold pages: 20 of 16384.
	shard := rowOf(out, "0")
	if want := []string{"0", "20/16384", "(0.1%)", "2/256", "1/512", "1/0", "1/0/1", "none"}; !cmp.Equal(shard, want) {
		t.Errorf("shard row: %s", cmp.Diff(want, shard))
	}
	prefill := rowOf(out, prefillA)
	if len(prefill) != 8 || prefill[1] != "1/1" || prefill[2] != "1/1/1" || prefill[3] != "heartbeats" || prefill[5] != "ago" || prefill[6] != "0" || prefill[7] != "2" {
		t.Errorf("prefill row = %q; want %s 1/1 1/1/1 heartbeats <age> ago 0 2 (rooms 1 and 4 are active)", prefill, prefillA)
	}

	out = d.mustCtl(t, "status", "--config")
	for _, want := range []string{
		"KEY                VALUE       SOURCE\n",
		"kv_pool.kind       gqa         default\n",
		"server.auth_token  <redacted>  env SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status --config output lacks %q:\n%s", want, out)
		}
	}
}

func TestRooms(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "rooms")
	lines := strings.Split(out, "\n")
	if want := "ROOM  RID    STATE            KVPOLL           AGE"; !strings.HasPrefix(lines[0], want) ||
		!strings.HasSuffix(lines[0], "PREFILL            PAGES  FAILURE") {
		t.Errorf("header = %q", lines[0])
	}
	rows := map[string][]string{}
	for _, id := range []string{"1", "2", "3", "4", "5"} {
		f := rowOf(out, id)
		if len(f) < 7 {
			t.Fatalf("no row for room %s:\n%s", id, out)
		}
		// Drop the age: it depends on the clock.
		rows[id] = append(f[:4:4], f[5:]...)
	}
	want := map[string][]string{
		"1": {"1", "req-1", "succeeded", "Success", prefillA + "/dp0", "16"},
		"2": {"2", "req-2", "released", "Success", prefillA + "/dp0", "5"},
		"3": {"3", "req-3", "failed", "Failed", prefillA + "/dp0", "8", "aborted:", "Aborted", "by", "AbortReq."},
		"4": {"4", "req-4", "admitted", "WaitingForInput", prefillA + "/dp0", "4"},
		"5": {"5", "req-5", "waiting_prefill", "Bootstrapping", prefillB, "0"},
	}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("rooms rows (-want +got):\n%s\n%s", diff, out)
	}
	if !strings.HasSuffix(out, "showing 5 of 5 rooms\n") {
		t.Errorf("rooms output does not end with the count:\n%s", out)
	}

	for _, tt := range []struct {
		args []string
		want []string
		foot string
	}{
		{[]string{"--phase", "succeeded,failed"}, []string{"3", "1"}, "showing 2 of 2 rooms"},
		{[]string{"--phase", "WAITING-PREFILL"}, []string{"5"}, "showing 1 of 1 rooms"},
		{[]string{"--live"}, []string{"5", "4", "1"}, "showing 3 of 3 rooms"},
		{[]string{"--prefill", prefillB}, []string{"5"}, "showing 1 of 1 rooms"},
		{[]string{"--limit", "2"}, []string{"5", "4"}, "showing 2 of 5 rooms"},
		{[]string{"--limit", "2", "--oldest"}, []string{"1", "2"}, "showing 2 of 5 rooms"},
		{[]string{"--live", "--prefill", prefillA, "--limit", "1"}, []string{"4"}, "showing 1 of 2 rooms"},
		{[]string{"--live", "--prefill", prefillA, "--limit", "1", "--oldest"}, []string{"1"}, "showing 1 of 2 rooms"},
		{[]string{"--phase", "held"}, nil, "No rooms."},
	} {
		out := d.mustCtl(t, append([]string{"rooms"}, tt.args...)...)
		if diff := cmp.Diff(tt.want, roomRows(out)); diff != "" {
			t.Errorf("rooms %v (-want +got):\n%s\n%s", tt.args, diff, out)
		}
		if !strings.HasSuffix(out, tt.foot+"\n") {
			t.Errorf("rooms %v does not end with %q:\n%s", tt.args, tt.foot, out)
		}
	}
}

// timeline returns the timeline rows of a room's output, as fields.
func timeline(t *testing.T, out string) [][]string {
	t.Helper()
	_, after, ok := strings.Cut(out, "Timeline:\n")
	if !ok {
		t.Fatalf("no timeline:\n%s", out)
	}
	lines := strings.Split(strings.TrimSuffix(after, "\n"), "\n")
	if h := strings.Fields(lines[0]); !cmp.Equal(h, []string{"OFFSET", "PHASE", "KVPOLL", "SGLANG", "NOTE"}) {
		t.Errorf("timeline header = %q", lines[0])
	}
	var rows [][]string
	for _, l := range lines[1:] {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}

var offsetRE = regexp.MustCompile(`^\+\d+\.\d{3}s$`)

func TestRoomTimeline(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "room", "1")
	for _, want := range []string{
		"Room:         1\n",
		"RID:          req-1\n",
		"State:        succeeded (KVPoll Success)\n",
		"Prefill:      " + prefillA + ", dp rank 0 (single_dp)\n",
		"Pages:        16\n",
		"Transferred:  4 chunks, 125.0 MiB\n",
		"Coverage:     prefill cp 0 tp 0 pp 0: 16/16 pages landed, 125.0 MiB, last chunk landed\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("room 1 output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "Failure:") || strings.Contains(out, "Page indices:") {
		t.Errorf("room 1 shows a failure or page indices:\n%s", out)
	}

	// One line per transition, in the daemon's order, with its SGLang
	// transition and an offset from the opening.
	room, err := d.c.Admin().GetRoom(testCtx(t), &pb.GetRoomRequest{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	var wantRows, gotRows [][]string
	var tnums []string
	for _, tr := range room.GetTransitions() {
		sg := tr.GetSglang()
		if sg == "" {
			sg = "-"
		}
		wantRows = append(wantRows, []string{phaseName(tr.GetPhase()), pollName(tr.GetPoll()), sg})
	}
	for _, f := range timeline(t, out) {
		if !offsetRE.MatchString(f[0]) {
			t.Errorf("offset %q is not +S.mmms", f[0])
		}
		gotRows = append(gotRows, f[1:4])
		if f[3] != "-" {
			tnums = append(tnums, strings.Split(f[3], "/")...)
		}
	}
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Errorf("timeline (-want +got):\n%s\n%s", diff, out)
	}
	if gotRows[0][0] != "waiting_prefill" || gotRows[0][2] != "T1" || gotRows[len(gotRows)-1][0] != "succeeded" {
		t.Errorf("timeline does not run from waiting_prefill (T1) to succeeded:\n%s", out)
	}
	// SGLang's decode path: T1 (bootstrap) … T11 (pre-allocated) … T17 (success), in this order.
	last := -1
	for _, tn := range []string{"T1", "T11", "T17"} {
		i := slices.Index(tnums, tn)
		if i <= last {
			t.Errorf("T-numbers %v: %s missing or out of order", tnums, tn)
		}
		last = i
	}

	out = d.mustCtl(t, "room", "1", "--pages")
	if !strings.Contains(out, "Page indices:  0-15\n") {
		t.Errorf("room 1 --pages lacks the page indices 0-15:\n%s", out)
	}
}

func TestRoomFailed(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "room", "3")
	if !strings.Contains(out, "State:        failed (KVPoll Failed)\n") || !strings.Contains(out, "Failure:      aborted: Aborted by AbortReq.\n") {
		t.Errorf("room 3 output lacks the failure:\n%s", out)
	}
	rows := timeline(t, out)
	if last := rows[len(rows)-1]; !cmp.Equal(last[1:], []string{"failed", "Failed", "T16", "Aborted", "by", "AbortReq."}) {
		t.Errorf("last transition = %q; want failed Failed T16 Aborted by AbortReq.", last)
	}

	out = d.mustCtl(t, "room", "5")
	if !strings.Contains(out, "Prefill:      "+prefillB+", dp rank unresolved\n") {
		t.Errorf("room 5 output:\n%s", out)
	}
}

func TestRoomNotFound(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	r := d.ctl("room", "42")
	if r.code != exitFailure || r.stdout != "" || r.stderr != "decodectl: room 42: NotFound: get room 42: room not found\n" {
		t.Errorf("room 42 on an empty daemon: %v", r)
	}
}

func TestAbort(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "abort", "4", "--reason", "operator: stuck")
	if out != "room 4 aborted: failed (aborted: operator: stuck)\n" {
		t.Errorf("abort 4 = %q", out)
	}
	if out := d.mustCtl(t, "abort", "4"); out != "room 4 had already ended (failed); nothing to abort\n" {
		t.Errorf("abort 4 again = %q", out)
	}
	out = d.mustCtl(t, "room", "4")
	if !strings.Contains(out, "Failure:      aborted: operator: stuck\n") {
		t.Errorf("room 4 after abort:\n%s", out)
	}
	if r := d.ctl("abort", "99"); r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: abort room 99: NotFound: ") {
		t.Errorf("abort 99: %v", r)
	}
}

func TestDrain(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	out := d.mustCtl(t, "drain")
	if !strings.HasPrefix(out, "draining: new rooms are refused (health NOT_SERVING); 3 rooms still in flight\n\n") {
		t.Errorf("drain output:\n%s", out)
	}
	if diff := cmp.Diff([]string{"1", "4", "5"}, roomRows(out)); diff != "" {
		t.Errorf("rooms in flight (-want +got):\n%s\n%s", diff, out)
	}
	out = d.mustCtl(t, "status")
	for _, want := range []string{"Ready:          no (draining)\n", "Health:         NOT_SERVING\n", "Draining:       yes"} {
		if !strings.Contains(out, want) {
			t.Errorf("status after drain lacks %q:\n%s", want, out)
		}
	}
	// Idempotent.
	d.mustCtl(t, "drain")
}

func TestDrainEmpty(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	if out := d.mustCtl(t, "drain"); out != "draining: new rooms are refused (health NOT_SERVING); no rooms in flight\n" {
		t.Errorf("drain = %q", out)
	}
}

func TestLookup(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	d.register(t, prefillRank(prefillA, 1, 0))
	// A DP-2 instance under follow_bootstrap_room (the default): room % 2.
	for dp := range uint32(2) {
		reg := prefillRank("10.0.0.3:8998", 1, 0)
		reg.RankEndpoint = "10.0.0.3:1700" + string(rune('0'+dp))
		reg.Parallel.AttnDpSize, reg.Parallel.AttnDpRank = 2, dp
		d.register(t, reg)
	}
	// A DP-2 instance that balances by itself: bindings only.
	var bound []*pb.RegisterPrefillRequest
	for dp := range uint32(2) {
		reg := prefillRank("10.0.0.4:8998", 1, 0)
		reg.RankEndpoint = "10.0.0.4:1700" + string(rune('0'+dp))
		reg.Parallel.AttnDpSize, reg.Parallel.AttnDpRank = 2, dp
		reg.LoadBalanceMethod = "round_robin"
		bound = append(bound, reg)
	}
	d.register(t, bound[0])
	p1 := d.register(t, bound[1])
	if _, err := p1.BindRoom(testCtx(t), 10); err != nil {
		t.Fatal(err)
	}

	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--prefill", prefillA, "7", "8"}, "ROOM  DP RANK  RULE\n7     0        single_dp\n8     0        single_dp\n"},
		{[]string{"--prefill", "10.0.0.3:8998", "7", "8"}, "ROOM  DP RANK  RULE\n7     1        follow_room\n8     0        follow_room\n"},
		{[]string{"10", "11", "--prefill", "10.0.0.4:8998", "--hint", "12=0"},
			"ROOM  DP RANK  RULE\n10    1        binding\n12    0        hint\nunresolved (no rule applies yet): 11\n"},
		{[]string{"--prefill", "10.0.0.4:8998", "11"}, "unresolved (no rule applies yet): 11\n"},
	} {
		if out := d.mustCtl(t, append([]string{"lookup"}, tt.args...)...); out != tt.want {
			t.Errorf("lookup %v:\n%s\nwant:\n%s", tt.args, out, tt.want)
		}
	}
	if r := d.ctl("lookup", "--prefill", "10.0.0.99:8998", "1"); r.code != exitFailure || !strings.Contains(r.stderr, "decodectl: lookup: NotFound: ") {
		t.Errorf("lookup on an unknown prefill: %v", r)
	}
}

// jsonKeys returns the top-level keys of a JSON object.
func jsonKeys(t *testing.T, out string) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestJSON(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	for _, tt := range []struct {
		args []string
		msg  proto.Message
		keys []string
		// check inspects the parsed answer.
		check func(m proto.Message) bool
	}{
		{
			args: []string{"status"}, msg: &pb.GetStatusResponse{},
			keys: []string{"config", "layout", "prefills", "readiness", "ready", "rooms_by_phase", "shards", "started_at", "transfer_path", "uptime", "version"},
			check: func(m proto.Message) bool {
				s := m.(*pb.GetStatusResponse)
				return s.GetVersion() == "test-1.2.3" && s.GetRoomsByPhase()["failed"] == 1 && s.GetShards()[0].GetPagesTotal() == 16384
			},
		},
		{
			args: []string{"rooms", "--phase", "failed"}, msg: &pb.ListRoomsResponse{},
			keys: []string{"rooms", "total"},
			check: func(m proto.Message) bool {
				l := m.(*pb.ListRoomsResponse)
				return l.GetTotal() == 1 && l.GetRooms()[0].GetFailure().GetCode() == pb.FailureCode_FAILURE_CODE_ABORTED
			},
		},
		{
			args: []string{"room", "1", "--pages"}, msg: &pb.Room{},
			keys: []string{"attempt", "bootstrap_addr", "bytes_transferred", "chunks_done", "dp_rank_rule", "max_new_tokens", "num_pages", "opened_at", "page_indices", "phase", "poll", "prefill_dp_rank", "prompt_len", "rid", "room", "transitions", "updated_at"},
			check: func(m proto.Message) bool {
				r := m.(*pb.Room)
				return r.GetPhase() == pb.RoomPhase_ROOM_PHASE_SUCCEEDED && len(r.GetPageIndices()) == 16 && r.GetTransitions()[0].GetSglang() == "T1"
			},
		},
		{
			args: []string{"lookup", "--prefill", prefillA, "4"}, msg: &pb.LookupDPRanksResponse{},
			keys: []string{"resolved"},
			check: func(m proto.Message) bool {
				return m.(*pb.LookupDPRanksResponse).GetResolved()[0].GetRule() == pb.DPRankRule_DP_RANK_RULE_SINGLE_DP
			},
		},
		{
			args: []string{"fleet"}, msg: &pb.GetFleetResponse{},
			keys: []string{"daemons", "prefills", "registry", "truncated"},
			check: func(m proto.Message) bool {
				f := m.(*pb.GetFleetResponse)
				return f.GetRegistry().GetBackend() == "memory" && len(f.GetDaemons()) == 1 && f.GetDaemons()[0].GetSelf() &&
					len(f.GetPrefills()) == 1 && f.GetPrefills()[0].GetBootstrapAddr() == prefillA
			},
		},
		{
			args: []string{"abort", "4"}, msg: &pb.AbortRoomResponse{},
			keys: []string{"room"},
			check: func(m proto.Message) bool {
				return m.(*pb.AbortRoomResponse).GetRoom().GetPhase() == pb.RoomPhase_ROOM_PHASE_FAILED
			},
		},
		{
			args: []string{"drain"}, msg: &pb.DrainResponse{},
			keys:  []string{"rooms_in_flight"},
			check: func(m proto.Message) bool { return m.(*pb.DrainResponse).GetRoomsInFlight() == 2 },
		},
	} {
		// -o before the command, --output after it; the mutating commands
		// run once.
		variants := [][]string{append([]string{"-o", "json"}, tt.args...), append(slices.Clone(tt.args), "--output", "json")}
		if tt.args[0] == "abort" || tt.args[0] == "drain" {
			variants = variants[:1]
		}
		for _, args := range variants {
			out := d.mustCtl(t, args...)
			// Every field is emitted, zero values included, under its proto name.
			var all []string
			fields := tt.msg.ProtoReflect().Descriptor().Fields()
			for i := range fields.Len() {
				all = append(all, string(fields.Get(i).Name()))
			}
			slices.Sort(all)
			if diff := cmp.Diff(all, jsonKeys(t, out)); diff != "" {
				t.Errorf("decodectl %v: JSON keys (-every field of %T +got):\n%s", args, tt.msg, diff)
			}
			for _, k := range tt.keys {
				if !slices.Contains(all, k) {
					t.Errorf("test table: %q is not a field of %T", k, tt.msg)
				}
			}
			m := proto.Clone(tt.msg)
			if err := protojson.Unmarshal([]byte(out), m); err != nil {
				t.Errorf("decodectl %v: not a %T: %v", args, m, err)
			} else if !tt.check(m) {
				t.Errorf("decodectl %v: unexpected answer:\n%s", args, out)
			}
		}
	}
}

func TestFlagsAnywhereAndEnv(t *testing.T) {
	t.Parallel()
	d := scenario(t)
	want := d.mustCtl(t, "room", "1", "--pages")
	for _, tt := range []struct {
		environ []string
		args    []string
	}{
		{nil, []string{"--addr", d.addr, "room", "--pages", "1"}},
		{nil, []string{"room", "1", "--addr", d.addr, "--pages"}},
		{nil, []string{"--pages", "--addr=" + d.addr, "room", "1"}},
		{[]string{"DECODEPLANE_ADDR=" + d.addr}, []string{"room", "1", "--pages"}},
		// The flag wins over the environment.
		{[]string{"DECODEPLANE_ADDR=127.0.0.1:1"}, []string{"room", "1", "--pages", "--addr", d.addr}},
	} {
		r := decodectl(tt.environ, tt.args...)
		if r.code != exitOK || r.stdout == "" {
			t.Errorf("decodectl %v (env %v): %v", tt.args, tt.environ, r)
			continue
		}
		// The ages may differ by now; the rest may not.
		if a, b := stripTimes(r.stdout), stripTimes(want); a != b {
			t.Errorf("decodectl %v:\n%s\nwant:\n%s", tt.args, a, b)
		}
	}
	// "--" ends the flags: "--pages" is then a second room ID.
	if r := d.ctl("room", "--", "1", "--pages"); r.code != exitUsage || !strings.Contains(r.stderr, "one room ID expected, got 2 arguments") {
		t.Errorf("room -- 1 --pages: %v", r)
	}
}

var timesRE = regexp.MustCompile(`\(\S+ ago\)`)

// stripTimes removes the ages ("(5ms ago)") from an output.
func stripTimes(s string) string { return timesRE.ReplaceAllString(s, "(…)") }

func TestToken(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{token: "s3cret"})
	d.register(t, prefillRank(prefillA, 1, 0))
	d.open(t, prefillA, 1, 100)
	d.open(t, prefillA, 2, 100)

	// Reads need no token.
	d.mustCtl(t, "status")
	d.mustCtl(t, "rooms")

	r := d.ctl("abort", "1")
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: abort room 1: Unauthenticated: ") ||
		!strings.Contains(r.stderr, "pass --token or set DECODEPLANE_TOKEN") {
		t.Errorf("abort without the token: %v", r)
	}
	if r := d.ctl("abort", "1", "--token", "wrong"); r.code != exitFailure || !strings.Contains(r.stderr, "Unauthenticated") ||
		!strings.Contains(r.stderr, "the daemon rejected the token given with --token or DECODEPLANE_TOKEN") {
		t.Errorf("abort with a wrong token: %v", r)
	}
	if out := d.mustCtl(t, "abort", "1", "--token", "s3cret"); !strings.HasPrefix(out, "room 1 aborted") {
		t.Errorf("abort with --token = %q", out)
	}
	r = decodectl([]string{"DECODEPLANE_TOKEN=s3cret", "DECODEPLANE_ADDR=" + d.addr}, "abort", "2")
	if r.code != exitOK || !strings.HasPrefix(r.stdout, "room 2 aborted") {
		t.Errorf("abort with DECODEPLANE_TOKEN: %v", r)
	}
	if r := d.ctl("drain"); r.code != exitFailure || !strings.Contains(r.stderr, "decodectl: drain: Unauthenticated: ") {
		t.Errorf("drain without the token: %v", r)
	}
	if out := d.mustCtl(t, "--token", "s3cret", "drain"); !strings.HasPrefix(out, "draining") {
		t.Errorf("drain with the token = %q", out)
	}
}

func TestUnreachable(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: a listener closed at once.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	r := decodectl(nil, "status", "--addr", addr, "--timeout", "2s")
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "decodectl: status: Unavailable: ") ||
		!strings.Contains(r.stderr, "is the daemon running at "+addr+"?") {
		t.Errorf("status of nobody: %v", r)
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string // on stderr
	}{
		{nil, "Usage:"},
		{[]string{"--addr", "127.0.0.1:1"}, "Usage:"},
		{[]string{"frobnicate"}, `decodectl: unknown command "frobnicate"`},
		{[]string{"help", "frobnicate"}, `decodectl: unknown command "frobnicate"`},
		{[]string{"rooms", "--bogus"}, "decodectl: unknown flag --bogus\nRun 'decodectl help rooms' for usage."},
		{[]string{"status", "-x"}, "decodectl: unknown flag -x"},
		{[]string{"status", "--pages"}, "decodectl: unknown flag --pages"},
		{[]string{"status", "extra"}, `decodectl: unexpected argument "extra"`},
		{[]string{"room"}, "decodectl: missing room ID"},
		{[]string{"room", "abc"}, `decodectl: bad room ID "abc": want an integer in [1, 2^63-1]`},
		{[]string{"room", "0"}, `decodectl: bad room ID "0"`},
		{[]string{"room", "-5"}, "decodectl: unknown flag -5"},
		{[]string{"room", "9223372036854775808"}, `decodectl: bad room ID "9223372036854775808"`},
		{[]string{"room", "1", "2"}, "decodectl: one room ID expected, got 2 arguments"},
		{[]string{"abort"}, "decodectl: missing room ID"},
		{[]string{"lookup", "1"}, "decodectl: --prefill ADDR is required"},
		{[]string{"lookup", "--prefill", prefillA}, "decodectl: missing ROOM"},
		{[]string{"lookup", "--prefill", prefillA, "x"}, `decodectl: bad room ID "x"`},
		{[]string{"lookup", "--prefill", prefillA, "--hint", "5"}, "want ROOM=DP_RANK"},
		{[]string{"rooms", "--phase", "running"}, `decodectl: --phase: unknown phase "running" (phases: waiting_prefill, resolving_dp_rank,`},
		{[]string{"rooms", "--limit", "-1"}, "decodectl: invalid value \"-1\" for flag -limit"},
		{[]string{"rooms", "-w", "--interval", "0s"}, "decodectl: --interval 0s: must be positive"},
		{[]string{"status", "-o", "yaml"}, `decodectl: -o "yaml": want text or json`},
		{[]string{"status", "--timeout", "0"}, "decodectl: --timeout 0s: must be positive"},
		{[]string{"status", "--addr", ""}, "decodectl: --addr is empty"},
		{[]string{"status", "--tls-cert", "c.pem"}, "decodectl: --tls-cert and --tls-key go together"},
		{[]string{"status", "--tls=false", "--tls-ca", "ca.pem"}, "decodectl: --tls=false contradicts"},
		{[]string{"status", "--tls-ca", "/nonexistent/ca.pem"}, "decodectl: --tls-ca: open /nonexistent/ca.pem: no such file or directory"},
		{[]string{"version", "now"}, `decodectl: unexpected argument "now"`},
	} {
		r := decodectl(nil, tt.args...)
		if r.code != exitUsage || r.stdout != "" || !strings.Contains(r.stderr, tt.want) {
			t.Errorf("decodectl %q: %v\nwant exit 2 and %q on stderr", tt.args, r, tt.want)
		}
	}
}

func TestHelpAndVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help"}, {"-h"}, {"--help"}, {"--addr", "x", "--help"}} {
		r := decodectl(nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout, "Commands:\n  status") || r.stderr != "" {
			t.Errorf("decodectl %v: %v", args, r)
		}
		for _, c := range commands {
			if !strings.Contains(r.stdout, "\n  "+c.name+" ") {
				t.Errorf("decodectl %v does not list %s", args, c.name)
			}
		}
	}
	for _, args := range [][]string{{"help", "rooms"}, {"rooms", "-h"}, {"rooms", "--help"}, {"--addr", "x", "help", "rooms"}} {
		r := decodectl(nil, args...)
		if r.code != exitOK || !strings.HasPrefix(r.stdout, "decodectl rooms — ") || !strings.Contains(r.stdout, "--phase P,...") {
			t.Errorf("decodectl %v: %v", args, r)
		}
	}
	if r := decodectl(nil, "version"); r.code != exitOK || r.stdout != "decodectl v0.0.0-dev (commit unknown, "+runtime.Version()+")\n" {
		t.Errorf("version: %v", r)
	}
	if r := decodectl(nil, "version", "-o", "json"); r.code != exitOK || !cmp.Equal(jsonKeys(t, r.stdout), []string{"version"}) {
		t.Errorf("version -o json: %v", r)
	}
}

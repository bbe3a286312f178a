package main

// TestMemLimitE2EWorstInputs runs the real daemon and sends it the worst
// inputs we could think of over every RPC: parallel sizes up to 2^32-1,
// thousands of prefill instances, strings of 1 MiB, repeated fields of
// 100,000 entries (and aux/page lists filling the 4 MiB message limit),
// every numeric field at its maximum. Each call may be refused (any status
// code: which one is the wire layer's business) or accepted; what must hold
// is that none hangs, the daemon keeps serving, a normal hand-off still
// succeeds afterwards, and its resident memory stays under memLimitRSS.
//
// The bound: the idle daemon's RSS is about 20 MiB; the largest request is
// 4 MiB on the wire (gRPC's default limit) and a few tens of MiB decoded and
// answered; the daemon runs with GOMEMLIMIT=128MiB so the GC returns garbage
// promptly. 256 MiB leaves room for all of that twice over, while every
// failure of that class found so far grew the daemon by gigabytes
// (RegisterPrefill with attn_tp_size 2^31: past 4 GiB in 7 s). The kernel's
// peak (VmHWM) is checked, not a sample, so a spike between polls counts.
//
// The test logs, per RPC, how many calls were refused with which code and
// the first message of each kind: that is the record of which inputs the
// wire check refuses today (room ids >= 2^63, strings over their bounds,
// ListRooms limits over 100,000, WatchWatermark lists over 1,024, ...) and
// which reach the domain (as of this writing, parallel sizes: the domain
// refuses a mapping over 65,536 target ranks and accepts the rest without
// allocating for them). Tightening the wire bounds moves inputs from one
// column to the other; the assertions do not depend on it.

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

const (
	memLimitRSS   = 256 << 20
	memLimitGoMem = "128MiB"
	// memLimitCall bounds every call: an accepted call that does not answer
	// within it is a hang.
	memLimitCall = 20 * time.Second
)

// procStatusKB reads one "Vm...: N kB" line of /proc/<pid>/status.
func procStatusKB(pid int, key string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", key, pid)
}

// memTally counts the outcome of every call per RPC.
type memTally struct {
	mu     sync.Mutex
	byR    map[string]map[string]int
	sample map[string]string // rpc/code -> the first refusal's message, cut
}

func (m *memTally) add(rpc string, err error) {
	code := "OK"
	if err != nil {
		code = status.Code(err).String()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byR == nil {
		m.byR, m.sample = map[string]map[string]int{}, map[string]string{}
	}
	if k := rpc + " " + code; err != nil && m.sample[k] == "" {
		msg := status.Convert(err).Message()
		m.sample[k] = msg[:min(len(msg), 160)]
	}
	if m.byR[rpc] == nil {
		m.byR[rpc] = map[string]int{}
	}
	m.byR[rpc][code]++
}

func (m *memTally) String() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var rpcs []string
	for r := range m.byR {
		rpcs = append(rpcs, r)
	}
	sort.Strings(rpcs)
	var b strings.Builder
	for _, r := range rpcs {
		var codes []string
		for c, n := range m.byR[r] {
			codes = append(codes, fmt.Sprintf("%s %d", c, n))
		}
		sort.Strings(codes)
		fmt.Fprintf(&b, "  %-18s %s\n", r, strings.Join(codes, ", "))
	}
	var keys []string
	for k := range m.sample {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	b.WriteString("first refusal of each kind:\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s: %s\n", k, m.sample[k])
	}
	return b.String()
}

type memLimitRun struct {
	t     *testing.T
	pid   int
	conn  *grpc.ClientConn
	boot  pb.BootstrapClient
	rooms pb.RoomsClient
	stg   pb.StagingClient
	admin pb.AdminClient
	tally memTally
}

// call runs one RPC under memLimitCall. Any status code is acceptable; a
// deadline (a hang), Unavailable (the daemon is gone) or a transport error
// fails the test.
func (r *memLimitRun) call(rpc string, f func(ctx context.Context) error) error {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), memLimitCall)
	defer cancel()
	err := f(ctx)
	r.tally.add(rpc, err)
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled:
		r.t.Fatalf("%s: %v (the daemon hung or went away)", rpc, err)
	}
	return err
}

// healthy checks the daemon serves and answers GetStatus, and returns its RSS.
func (r *memLimitRun) healthy(phase string) int64 {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(r.t.Context(), memLimitCall)
	defer cancel()
	hr, err := healthpb.NewHealthClient(r.conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		r.t.Fatalf("after %s: health %v, %v; want SERVING", phase, hr, err)
	}
	if _, err := r.admin.GetStatus(ctx, &pb.GetStatusRequest{}); err != nil {
		r.t.Fatalf("after %s: GetStatus: %v", phase, err)
	}
	rss, err := procStatusKB(r.pid, "VmRSS")
	if err != nil {
		r.t.Fatal(err)
	}
	hwm, _ := procStatusKB(r.pid, "VmHWM")
	r.t.Logf("after %-28s RSS %6.1f MiB, peak %6.1f MiB", phase+":", float64(rss)/1024, float64(hwm)/1024)
	if hwm<<10 >= memLimitRSS {
		r.t.Fatalf("after %s: peak RSS %d KiB >= %d MiB", phase, hwm, memLimitRSS>>20)
	}
	return rss
}

func TestMemLimitE2EWorstInputs(t *testing.T) {
	t.Parallel()
	// Heartbeats every 2 s (SGLang's floor) so that silent ranks show in
	// GetStatus soon; 600 failures so that no instance dies during the test.
	cfgPath := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(cfgPath, []byte("timeouts:\n  heartbeat_interval: 2s\n  heartbeat_max_failures: 600\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var p *daemonProc
	var addr string
	for attempt := 1; ; attempt++ {
		addr = freeAddr(t)
		p = startDaemon(t, []string{"serve", "--config", cfgPath, "--listen", addr, "--set", "server.metrics_listen="}, e2eEnviron("GOMEMLIMIT="+memLimitGoMem))
		err := roomsWaitServing(t, p, addr)
		if err == nil {
			break
		}
		if attempt < 3 && strings.Contains(p.Out.String(), "address already in use") {
			continue
		}
		t.Fatalf("the daemon did not serve: %v\n%s", err, p.Out.String())
	}
	t.Cleanup(func() {
		if t.Failed() {
			out := p.Out.String()
			t.Logf("daemon output (last 4 KiB):\n%s", out[max(0, len(out)-4096):])
		}
	})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := &memLimitRun{t: t, pid: p.Cmd.Process.Pid, conn: conn, boot: pb.NewBootstrapClient(conn), rooms: pb.NewRoomsClient(conn),
		stg: pb.NewStagingClient(conn), admin: pb.NewAdminClient(conn)}
	base := r.healthy("start")

	// A normal prefill instance (TP 1) with its heartbeat loop, for the
	// rooms below and the hand-off at the end.
	d := &roomsDaemon{addr: addr}
	d.c = d.newClient(t, "")
	const good = "10.20.0.1:8998"
	ranks := d.startRanks(t, roomsInstance(good, 1, 1, "", nil)...)
	goodRank := ranks[0].Rank()

	// 1. RegisterPrefill: every parallel size at 65,536, 2^31 and 2^32-1
	// (its rank the last one), every size at 1,024 and at 2^32-1 together.
	const max32 = math.MaxUint32
	sizes := []uint32{1 << 16, 1 << 31, max32}
	set := []func(p *pb.ParallelInfo, v uint32){
		func(p *pb.ParallelInfo, v uint32) { p.AttnTpSize, p.AttnTpRank = v, v-1 },
		func(p *pb.ParallelInfo, v uint32) { p.PpSize, p.PpRank = v, v-1 },
		func(p *pb.ParallelInfo, v uint32) { p.AttnDpSize, p.AttnDpRank = v, v-1 },
		func(p *pb.ParallelInfo, v uint32) { p.AttnCpSize, p.AttnCpRank = v, v-1 },
		func(p *pb.ParallelInfo, v uint32) { p.SystemDpSize, p.SystemDpRank = v, v-1 },
	}
	huge := 0
	register := func(par *pb.ParallelInfo) {
		huge++
		reg := roomsReg(fmt.Sprintf("10.30.%d.%d:8998", huge/250, huge%250), 1, 0, 1, 0, "")
		reg.Parallel = par
		r.call("RegisterPrefill", func(ctx context.Context) error { _, err := r.boot.RegisterPrefill(ctx, reg); return err })
	}
	for _, f := range set {
		for _, v := range sizes {
			par := &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1, SystemDpSize: 1}
			f(par, v)
			register(par)
		}
	}
	for _, v := range []uint32{1024, max32} {
		par := &pb.ParallelInfo{}
		for _, f := range set[:4] {
			f(par, v)
		}
		register(par)
	}
	// Heartbeats and DP lookups against those instances, ranks at the maximum.
	for i := 1; i <= huge; i++ {
		a := fmt.Sprintf("10.30.%d.%d:8998", i/250, i%250)
		rk := &pb.PrefillRank{BootstrapAddr: a, DpRank: max32 - 1, CpRank: max32 - 1, TpRank: max32 - 1, PpRank: max32 - 1}
		r.call("Heartbeat", func(ctx context.Context) error {
			_, err := r.boot.Heartbeat(ctx, &pb.HeartbeatRequest{Rank: rk})
			return err
		})
		r.call("BindRoom", func(ctx context.Context) error {
			_, err := r.boot.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: a, Room: math.MaxUint64, DpRank: max32 - 1})
			return err
		})
		r.call("SetupStaging", func(ctx context.Context) error {
			_, err := r.stg.SetupStaging(ctx, &pb.SetupStagingRequest{Rank: rk})
			return err
		})
	}
	r.healthy("huge parallel sizes")

	// 2. Many instances: 2,000 addresses, one rank each of a TP 8 instance
	// that never completes.
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 2000; i += 8 {
				reg := roomsReg(fmt.Sprintf("10.40.%d.%d:8998", i/250, i%250), 8, 0, 1, 0, "")
				reg.InstanceId = strings.Repeat("i", 200) + strconv.Itoa(i)
				r.call("RegisterPrefill", func(ctx context.Context) error { _, err := r.boot.RegisterPrefill(ctx, reg); return err })
			}
		})
	}
	wg.Wait()
	r.healthy("2,000 instances")

	// 3. Strings of 1 MiB in every string field (three per message stays
	// under the 4 MiB message limit).
	mib := strings.Repeat("x", 1<<20)
	for i := range 4 {
		reg := roomsReg(fmt.Sprintf("10.50.0.%d:8998", i), 1, 0, 1, 0, mib)
		reg.RankEndpoint, reg.InstanceId = mib, mib
		r.call("RegisterPrefill", func(ctx context.Context) error { _, err := r.boot.RegisterPrefill(ctx, reg); return err })
		reg = roomsReg(mib, 1, 0, 1, 0, "")
		reg.KvCacheDtype, reg.Model, reg.InstanceId = mib, &pb.ModelFacts{KvPoolKind: mib}, "x"
		r.call("RegisterPrefill", func(ctx context.Context) error { _, err := r.boot.RegisterPrefill(ctx, reg); return err })
		room := uint64(900000 + i)
		r.call("OpenRoom", func(ctx context.Context) error {
			_, err := r.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: mib, BootstrapAddr: good, Room: room, PromptLen: 100, MaxNewTokens: 16, IdempotencyKey: mib})
			return err
		})
		r.call("AbortRoom", func(ctx context.Context) error {
			_, err := r.rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: mib + mib + mib})
			return err
		})
		r.call("ReportTransfer", func(ctx context.Context) error {
			_, err := r.rooms.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: room, Rank: goodRank, FailureReason: mib + mib + mib})
			return err
		})
		r.call("LookupDPRanks", func(ctx context.Context) error {
			_, err := r.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: mib + mib + mib})
			return err
		})
	}
	r.healthy("1 MiB strings")

	// 4. Claims for rooms that do not exist (pending, bounded) and for the
	// extreme room ids; chunks with every field at its maximum and lists
	// filling the message limit.
	var streams []context.CancelFunc
	for i := range 300 {
		ctx, cancel := context.WithCancel(t.Context())
		streams = append(streams, cancel)
		s, err := r.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: uint64(700000 + i), Rank: goodRank})
		if err == nil {
			go func() { s.Recv() }()
		}
	}
	for _, room := range []uint64{0, math.MaxUint64} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		s, err := r.rooms.AwaitDestination(ctx, &pb.AwaitDestinationRequest{Room: room, Rank: &pb.PrefillRank{BootstrapAddr: mib[:1000], DpRank: max32, TpRank: max32}})
		if err == nil {
			_, err = s.Recv()
		}
		cancel()
		if status.Code(err) != codes.DeadlineExceeded { // a wait for a room that may open is allowed to wait
			r.tally.add("AwaitDestination", err)
		}
	}
	// A room the good rank claims (before the rooms below queue in front of
	// it), then chunks at the extremes.
	const claimed = 600001
	if _, err := d.c.OpenRoom(t.Context(), roomsOpen(good, claimed, 300)); err != nil {
		t.Fatalf("OpenRoom %d: %v", claimed, err)
	}
	cs, dest := roomsAwaitDestination(t, roomsCtx(t), ranks[0], claimed)
	defer cs.Close()
	// 700,000 int32 near the maximum are 3.5 MB on the wire: under the 4 MiB
	// message limit, so the daemon has to handle them.
	ids := make([]int32, 700000)
	for i := range ids {
		ids[i] = math.MaxInt32 - int32(i)
	}
	for _, room := range []uint64{claimed, 0, math.MaxUint64, 100001} {
		r.call("Transfer", func(ctx context.Context) error {
			_, err := r.rooms.Transfer(ctx, &pb.TransferRequest{Room: room, Rank: goodRank, ChunkIndex: max32, PageOffset: max32, NumPages: max32, Last: true,
				Source: &pb.TransferSource{Buffer: mib[:1000], PageIndices: ids[:350000]}, Aux: &pb.Aux{RoomMarker: math.MaxUint64, OutputIds: ids[:350000]}, Attempt: max32})
			return err
		})
		r.call("Transfer", func(ctx context.Context) error {
			_, err := r.rooms.Transfer(ctx, &pb.TransferRequest{Room: room, Rank: goodRank, ChunkIndex: 7, NumPages: 1, Aux: &pb.Aux{OutputIds: ids}})
			return err
		})
		r.call("ReportTransfer", func(ctx context.Context) error {
			_, err := r.rooms.ReportTransfer(ctx, &pb.ReportTransferRequest{Room: room, Rank: goodRank, ChunkIndex: max32, PageOffset: max32, NumPages: max32,
				Last: true, Success: true, Bytes: math.MaxUint64, MetadataRoomMarker: math.MaxUint64, Attempt: max32})
			return err
		})
		r.call("AllocateStaging", func(ctx context.Context) error {
			_, err := r.stg.AllocateStaging(ctx, &pb.AllocateStagingRequest{Room: room, Rank: goodRank, ChunkIndex: max32, NumPages: max32})
			return err
		})
		r.call("ChunkReady", func(ctx context.Context) error {
			_, err := r.stg.ChunkReady(ctx, &pb.ChunkReadyRequest{Room: room, Rank: goodRank, ChunkIndex: max32, PageOffset: max32, NumPages: max32, Last: true})
			return err
		})
		r.call("GetRoom", func(ctx context.Context) error {
			_, err := r.rooms.GetRoom(ctx, &pb.GetRoomRequest{Room: room, IncludePages: true})
			return err
		})
		for _, mode := range []pb.RetractMode{pb.RetractMode_RETRACT_MODE_RETRACT, pb.RetractMode_RETRACT_MODE_REBOOTSTRAP, pb.RetractMode(1 << 30)} {
			r.call("RetractRoom", func(ctx context.Context) error {
				_, err := r.rooms.RetractRoom(ctx, &pb.RetractRoomRequest{Room: room, Mode: mode})
				return err
			})
		}
		r.call("ReleaseRoom", func(ctx context.Context) error {
			_, err := r.rooms.ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: room})
			return err
		})
		func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			defer cancel()
			s, err := r.rooms.WatchRoom(ctx, &pb.WatchRoomRequest{Room: room, History: true})
			if err == nil {
				_, err = s.Recv()
			}
			r.tally.add("WatchRoom", err)
		}()
	}
	_ = dest
	for _, cancel := range streams {
		cancel()
	}
	r.healthy("chunks, claims, staging")

	// 5. Rooms: every length at its maximum (with and without rebootstrap),
	// then 2,000 ordinary rooms queued on the good instance.
	for i, rb := range []bool{false, true} {
		r.call("OpenRoom", func(ctx context.Context) error {
			_, err := r.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "max", BootstrapAddr: good, Room: math.MaxUint64 - uint64(i),
				PromptLen: max32, OutputLen: max32, MaxNewTokens: max32, Priority: math.MinInt32, Rebootstrap: rb,
				PrefillDpRank: new(uint32(max32)), DecodeDpRank: new(uint32(max32))})
			return err
		})
		r.call("OpenRoom", func(ctx context.Context) error {
			_, err := r.rooms.OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "max", BootstrapAddr: good, Room: 800000 + uint64(i),
				PromptLen: 300, OutputLen: max32, MaxNewTokens: max32, Priority: math.MaxInt32, Rebootstrap: rb})
			return err
		})
	}
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 2000; i += 8 {
				req := roomsOpen(good, uint64(100000+i), 100)
				r.call("OpenRoom", func(ctx context.Context) error { _, err := r.rooms.OpenRoom(ctx, req); return err })
			}
		})
	}
	wg.Wait()
	phases := make([]pb.RoomPhase, 100000)
	for i := range phases {
		phases[i] = pb.RoomPhase(i % 12)
	}
	for _, req := range []*pb.ListRoomsRequest{
		{Limit: max32}, {Limit: max32, NewestFirst: true}, {Phases: phases, Limit: max32}, {BootstrapAddr: mib, Limit: max32, LiveOnly: true},
		{Limit: pb.MaxListLimit}, {Limit: pb.MaxListLimit, NewestFirst: true}, {Phases: phases}, {}, {BootstrapAddr: good, LiveOnly: true},
	} {
		r.call("ListRooms", func(ctx context.Context) error { _, err := r.rooms.ListRooms(ctx, req); return err })
	}
	r.healthy("2,000 rooms, ListRooms")

	// 6. Repeated fields of 100,000 entries.
	roomIDs := make([]uint64, 100000)
	hints := make([]*pb.RoomHint, 100000)
	usage := make([]*pb.RunningUsage, 100000)
	tpRanks := make([]uint32, 100000)
	for i := range roomIDs {
		roomIDs[i] = uint64(100000 + i)
		hints[i] = &pb.RoomHint{Room: uint64(i), DpRank: max32 - uint32(i)}
		usage[i] = &pb.RunningUsage{Room: uint64(100000 + i), OutputLen: max32}
		tpRanks[i] = max32 - uint32(i)
	}
	for _, a := range []string{good, "10.30.0.1:8998", "10.40.0.1:8998"} {
		r.call("LookupDPRanks", func(ctx context.Context) error {
			_, err := r.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: a, Rooms: roomIDs})
			return err
		})
		r.call("LookupDPRanks", func(ctx context.Context) error {
			_, err := r.boot.LookupDPRanks(ctx, &pb.LookupDPRanksRequest{BootstrapAddr: a, Rooms: roomIDs[:50000], Hints: hints[:50000]})
			return err
		})
	}
	r.call("ReportRunning", func(ctx context.Context) error {
		_, err := r.rooms.ReportRunning(ctx, &pb.ReportRunningRequest{Rooms: usage})
		return err
	})
	for range 3 {
		r.call("ContinueGeneration", func(ctx context.Context) error {
			_, err := r.rooms.ContinueGeneration(ctx, &pb.ContinueGenerationRequest{})
			return err
		})
	}
	func() {
		ctx, cancel := context.WithTimeout(t.Context(), memLimitCall)
		defer cancel()
		s, err := r.stg.WatchWatermark(ctx, &pb.WatchWatermarkRequest{DecodeDpRank: max32, DecodeTpRanks: tpRanks})
		if err == nil {
			_, err = s.Recv()
		}
		r.tally.add("WatchWatermark", err)
	}()
	for i := range 5000 {
		if i%1000 == 0 {
			r.healthy(fmt.Sprintf("bindings %d", i))
		}
		r.call("BindRoom", func(ctx context.Context) error {
			_, err := r.boot.BindRoom(ctx, &pb.BindRoomRequest{BootstrapAddr: "10.30.0.7:8998", Room: uint64(i), DpRank: uint32(i)})
			return err
		})
	}
	r.healthy("100k repeated fields")

	// Abort what the sweep left open, so the hand-off below is not queued
	// behind it.
	open := []uint64{claimed, math.MaxUint64, math.MaxUint64 - 1, 800000, 800001}
	for i := range 2000 {
		open = append(open, uint64(100000+i))
	}
	for _, room := range open {
		r.call("AbortRoom", func(ctx context.Context) error {
			_, err := r.rooms.AbortRoom(ctx, &pb.AbortRoomRequest{Room: room, Reason: "memlimit sweep"})
			return err
		})
	}

	// Still serving rooms: a normal hand-off succeeds.
	ctx := roomsCtx(t)
	room, _ := d.handOff(t, ctx, roomsOpen(good, 500001, 200), ranks, 0)
	if room.GetPhase() != pb.RoomPhase_ROOM_PHASE_SUCCEEDED {
		t.Fatalf("hand-off after the sweep: phase %s", room.GetPhase())
	}
	end := r.healthy("a normal hand-off")

	// Liveness is per rank: the instances of step 2 never heartbeat, and
	// GetStatus names their silent rank once it missed a 2 s interval (polled
	// with the test's deadline: usually true at the first look).
	for {
		st, err := r.admin.GetStatus(ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		silent, bad := 0, ""
		for _, ps := range st.GetPrefills() {
			if !strings.HasPrefix(ps.GetBootstrapAddr(), "10.40.") {
				continue
			}
			sr := ps.GetSilentRanks()
			if len(sr) != 1 || ps.GetSilentRankCount() != 1 || sr[0].GetRank().GetBootstrapAddr() != ps.GetBootstrapAddr() ||
				sr[0].GetRank().GetTpRank() != 0 || sr[0].GetSilentFor().AsDuration() < 2*time.Second || sr[0].GetMissedHeartbeats() < 1 {
				bad = fmt.Sprintf("GetStatus of %s: silent ranks %v (%d), want its rank 0, silent for >= 2s", ps.GetBootstrapAddr(), sr, ps.GetSilentRankCount())
				continue
			}
			silent++
		}
		if silent == 2000 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("GetStatus lists %d of the 2,000 silent instances as silent; %s", silent, bad)
		}
		time.Sleep(100 * time.Millisecond)
	}
	hwm, err := procStatusKB(r.pid, "VmHWM")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("RSS: start %.1f MiB, end %.1f MiB, peak %.1f MiB (bound %d MiB, GOMEMLIMIT %s)", float64(base)/1024, float64(end)/1024, float64(hwm)/1024, memLimitRSS>>20, memLimitGoMem)
	t.Logf("outcomes per RPC:\n%s", r.tally.String())
	if hwm<<10 >= memLimitRSS {
		t.Errorf("peak RSS %.1f MiB >= %d MiB", float64(hwm)/1024, memLimitRSS>>20)
	}
}

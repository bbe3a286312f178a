package kvmanager

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// ParallelInfo is a prefill rank's parallel layout (SGLang's PUT /route body).
type ParallelInfo struct {
	AttnTP, AttnTPRank     int
	AttnCP, AttnCPRank     int
	AttnDP, AttnDPRank     int
	PP, PPRank             int
	SystemDP, SystemDPRank int
}

// dp returns the prefill's DP size and this rank's DP group as SGLang's
// bootstrap server keys them: attention DP when system_dp_size == 1, else
// the system DP rank.
func (p ParallelInfo) dp() (size, group int) {
	if p.SystemDP <= 1 {
		return max(1, p.AttnDP), p.AttnDPRank
	}
	return p.SystemDP, p.SystemDPRank
}

// ModelFacts are the prefill's KV layout facts; zero fields are not checked.
type ModelFacts struct {
	Kind          string
	NumLayers     int
	TotalKVHeads  int
	HeadDim       int
	KVLoraRank    int
	QKRopeHeadDim int
}

// Registration is one prefill rank registering (RegisterPrefill).
type Registration struct {
	Addr               string
	Endpoint           string
	InstanceID         string
	Parallel           ParallelInfo
	PageSize           int
	KVDType            string
	LoadBalanceMethod  string
	DSACacheLayerSplit bool
	HTTPPort           int
	Model              ModelFacts
}

// RegistrationResult is what a prefill rank learns when it registers.
type RegistrationResult struct {
	Mapping []DecodeRankMapping
	// Rank view: the decode TP ranks addressing this rank, whether it is a
	// dummy for all of them, and how many destinations it receives.
	ServesDecodeTP     []int
	Dummy              bool
	RequiredDstInfoNum int
	Staging            bool
	HeartbeatInterval  time.Duration
	MaxFailures        int
	Registered         int
	Expected           int
	Replaced           bool
	RoomsFailed        int
}

type prefillInstance struct {
	addr       string
	instanceID string
	topo       PrefillTopology
	pageSize   int
	dtype      string
	lbMethod   string
	httpPort   int
	ranks      map[RankID]*prefillRank
	expected   int
	complete   bool
	plan       *roomPlan
	unresolved map[uint64]*room // rooms waiting for a DP-rank binding
}

type prefillRank struct {
	id         RankID
	endpoint   string
	instanceID string
	lastSeen   time.Time
	missed     int // heartbeat intervals missed since lastSeen, as counted so far
}

// addrWait is SGLang's per-address topology retry budget (spec §4.3): rooms
// waiting for an instance's registration are re-checked with back-off
// 1, 1, 2, 4, 4, ... s; after PrefillInfoAttempts checks they fail (T3).
type addrWait struct {
	addr     string
	rooms    map[uint64]*room
	attempts int
	next     deadline // the next check, on the manager's deadline heap
}

// backoff returns the delay before check number n (0-based): base, base,
// 2·base, 4·base, ... capped.
func (t TimeoutConfig) backoff(n int) time.Duration {
	d := t.PrefillInfoBackoff
	for i := 1; i < n && d < t.PrefillInfoBackoffMax; i++ {
		d *= 2
	}
	return min(d, t.PrefillInfoBackoffMax)
}

func followsRoom(lbMethod string) bool {
	return lbMethod == "" || lbMethod == "follow_bootstrap_room"
}

// checkCompat applies SGLang's fatal checks (spec §4.3, §9.3) and the model
// facts; messages are SGLang's where it has them. A kv_pool_kind that is no
// kind at all is a bad value (InvalidError, InvalidArgument); facts that
// contradict this decode pool are ErrPrefillMismatch (FailedPrecondition),
// every contradiction listed at once.
func (m *Manager) checkCompat(reg Registration) error {
	d := m.layout
	f := reg.Model
	var kind prealloc.Kind
	if f.Kind != "" {
		k, err := prealloc.ParseKind(f.Kind)
		if err != nil {
			return invalid("model.kv_pool_kind", "%q is not a KV pool kind (allowed: %s)", f.Kind, strings.Join(prealloc.KindNames(), ", "))
		}
		kind = k
	}
	if reg.PageSize != d.PageSize {
		return fmt.Errorf("%w: Page size mismatch: prefill server has page_size=%d, but decode server has page_size=%d. Both servers must use the same --page-size value.", ErrPrefillMismatch, reg.PageSize, d.PageSize)
	}
	pd, ok := prealloc.CanonicalDType(reg.KVDType)
	if strings.EqualFold(strings.TrimSpace(reg.KVDType), "auto") && (d.DType == "bf16" || d.DType == "fp16") {
		pd, ok = d.DType, true
	}
	if !ok || pd != d.DType {
		return fmt.Errorf("%w: KV cache dtype mismatch: prefill server has kv_cache_dtype=%s, but decode server has kv_cache_dtype=%s. Both servers must use the same --kv-cache-dtype value.", ErrPrefillMismatch, reg.KVDType, d.DType)
	}
	if pp := reg.Parallel.PP; d.NumLayers > 0 && pp > d.NumLayers {
		return fmt.Errorf("%w: parallel.pp_size=%d exceeds the model's %d layers: a pipeline stage would hold no layer, so its KV could not be mapped onto the decode pool", ErrPrefillMismatch, pp, d.NumLayers)
	}
	var bad []string
	if f.Kind != "" && kind != d.Kind {
		bad = append(bad, fmt.Sprintf("kv_pool_kind %q (decode: %s)", f.Kind, d.Kind))
	}
	check := func(name string, got, want int) {
		if got != 0 && got != want {
			bad = append(bad, fmt.Sprintf("%s %d (decode: %d)", name, got, want))
		}
	}
	check("num_layers", f.NumLayers, d.NumLayers)
	if d.IsMLA {
		if f.TotalKVHeads > 1 {
			bad = append(bad, fmt.Sprintf("total_kv_heads %d (decode: %s pool, one latent KV vector per token)", f.TotalKVHeads, d.Kind))
		}
		// On an MLA pool head_dim is the width of one KV entry.
		check("head_dim", f.HeadDim, d.HeadDim)
		if f.KVLoraRank != 0 || f.QKRopeHeadDim != 0 {
			check("kv_lora_rank + qk_rope_head_dim", f.KVLoraRank+f.QKRopeHeadDim, d.HeadDim)
		}
	} else {
		check("total_kv_heads", f.TotalKVHeads, d.TotalKVHeads)
		check("head_dim", f.HeadDim, d.HeadDim)
		if f.KVLoraRank != 0 {
			bad = append(bad, fmt.Sprintf("kv_lora_rank %d (decode: %s pool, which has no latent dimension)", f.KVLoraRank, d.Kind))
		}
		if f.QKRopeHeadDim != 0 {
			bad = append(bad, fmt.Sprintf("qk_rope_head_dim %d (decode: %s pool, which has no decoupled RoPE part)", f.QKRopeHeadDim, d.Kind))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: the prefill's model does not match the decode KV pool: %s", ErrPrefillMismatch, strings.Join(bad, ", "))
	}
	return nil
}

// rankMappingOf is SGLang's mapping of this decode side against a prefill
// topology. It is computed per call and never kept: its lists grow with the
// prefill's sizes, and an instance must cost the same whatever they are.
func (m *Manager) rankMappingOf(topo PrefillTopology) ([]DecodeRankMapping, error) {
	return rankMapping(m.layout.AttnTP, m.layout.PP, m.layout.IsMLA, m.layout.Kind == prealloc.KindHybridMLA, topo)
}

// rankCount is the number of ranks an instance registers: dp × cp × tp × pp,
// saturating instead of overflowing (sizes are client-chosen). Registration
// completes when exactly that many distinct in-layout ranks registered; an
// instance whose count no deployment reaches simply never completes, and
// costs one table entry per RegisterPrefill call received.
func (p PrefillTopology) rankCount() int {
	n := 1
	for _, f := range []int{p.DP, p.AttnCP, p.AttnTP, p.PP} {
		f = max(1, f)
		if n > math.MaxInt/f {
			return math.MaxInt
		}
		n *= f
	}
	return n
}

// checkRankInLayout refuses a rank outside its own parallel sizes: the
// registration count is exact only if every rank it counts exists.
func checkRankInLayout(par ParallelInfo, id RankID, topo PrefillTopology) error {
	dpField, dpSize := "parallel.attn_dp_rank", "parallel.attn_dp_size"
	if par.SystemDP > 1 {
		dpField, dpSize = "parallel.system_dp_rank", "parallel.system_dp_size"
	}
	for _, c := range []struct {
		field, sizeField string
		rank, size       int
	}{
		{"parallel.attn_tp_rank", "parallel.attn_tp_size", id.TP, topo.AttnTP},
		{"parallel.attn_cp_rank", "parallel.attn_cp_size", id.CP, topo.AttnCP},
		{dpField, dpSize, id.DP, topo.DP},
		{"parallel.pp_rank", "parallel.pp_size", id.PP, topo.PP},
	} {
		if c.rank < 0 || c.rank >= c.size {
			return invalid(c.field, "%d is outside %s %d (allowed 0..%d)", c.rank, c.sizeField, c.size, c.size-1)
		}
	}
	return nil
}

// RegisterPrefill registers one prefill rank. It is idempotent per rank; a
// new endpoint for a known rank, or a new instance id for a known address,
// replaces the old registration and fails the rooms that depended on it.
func (m *Manager) RegisterPrefill(reg Registration) (RegistrationResult, error) {
	if err := m.checkCompat(reg); err != nil {
		return RegistrationResult{}, err
	}
	par := reg.Parallel
	dpSize, dpGroup := par.dp()
	topo := PrefillTopology{AttnTP: max(1, par.AttnTP), AttnCP: max(1, par.AttnCP), DP: dpSize, PP: max(1, par.PP),
		FollowBootstrapRoom: followsRoom(reg.LoadBalanceMethod), DSACacheLayerSplit: reg.DSACacheLayerSplit}
	mapping, err := m.rankMappingOf(topo)
	if err != nil {
		return RegistrationResult{}, fmt.Errorf("%w: %v", ErrPrefillMismatch, err)
	}
	id := RankID{Addr: reg.Addr, DP: dpGroup, CP: par.AttnCPRank, TP: par.AttnTPRank, PP: par.PPRank}
	if err := checkRankInLayout(par, id, topo); err != nil {
		return RegistrationResult{}, err
	}

	m.mu.Lock()
	defer m.unlock()
	now := m.clock.Now()
	res := RegistrationResult{}
	inst := m.prefills[reg.Addr]
	if inst != nil && reg.InstanceID != "" && inst.instanceID != "" && reg.InstanceID != inst.instanceID {
		res.RoomsFailed += m.killInstanceLocked(reg.Addr, FailurePrefillLost, fmt.Sprintf(
			"prefill instance %s was replaced (instance id %s -> %s)", reg.Addr, inst.instanceID, reg.InstanceID))
		res.Replaced = true
		inst = nil
	}
	if inst != nil && inst.topo != topo {
		return RegistrationResult{}, fmt.Errorf("%w: rank %s reports attn_tp=%d attn_cp=%d dp=%d pp=%d load_balance_method=%q, but %s registered attn_tp=%d attn_cp=%d dp=%d pp=%d follow_bootstrap_room=%v first; restart the instance with one layout (or with a new instance id)",
			ErrPrefillMismatch, id, topo.AttnTP, topo.AttnCP, topo.DP, topo.PP, reg.LoadBalanceMethod, reg.Addr,
			inst.topo.AttnTP, inst.topo.AttnCP, inst.topo.DP, inst.topo.PP, inst.topo.FollowBootstrapRoom)
	}
	if inst == nil {
		inst = &prefillInstance{
			addr: reg.Addr, instanceID: reg.InstanceID, topo: topo, pageSize: reg.PageSize, dtype: reg.KVDType,
			lbMethod: reg.LoadBalanceMethod, httpPort: reg.HTTPPort, ranks: map[RankID]*prefillRank{},
			expected:   topo.rankCount(),
			plan:       newPlan(topo, m.layout.AttnTP, m.layout.TotalKVHeads, m.layout.IsMLA, m.layout.Kind == prealloc.KindHybridMLA, m.layout.Staging),
			unresolved: map[uint64]*room{},
		}
		m.prefills[reg.Addr] = inst
	}
	if inst.instanceID == "" {
		inst.instanceID = reg.InstanceID
	}
	if old := inst.ranks[id]; old != nil && old.endpoint != reg.Endpoint {
		res.Replaced = true
		res.RoomsFailed += m.failRoomsLocked(func(r *room) bool { return r.addr == reg.Addr && r.prefillDP == id.DP && r.handingOff() },
			Failure{Code: FailurePrefillLost, Message: fmt.Sprintf(
				"Prefill server with bootstrap_addr: %s is healthy before, but now it is down: rank %s re-registered with a new endpoint (%s -> %s). Requests bound to the old registration have been marked as failed.",
				reg.Addr, id, old.endpoint, reg.Endpoint)})
	}
	inst.ranks[id] = &prefillRank{id: id, endpoint: reg.Endpoint, instanceID: reg.InstanceID, lastSeen: now}
	m.obs.PrefillRegistered(reg.Addr, res.Replaced)
	if !inst.complete && len(inst.ranks) >= inst.expected {
		inst.complete = true
		inst.plan.enumerate() // bounded by the ranks registered (every required rank is one)
		m.log.Info("prefill instance registered", "bootstrap_addr", reg.Addr, "ranks", len(inst.ranks),
			"attn_tp", topo.AttnTP, "dp", topo.DP, "pp", topo.PP, "attn_cp", topo.AttnCP, "follow_bootstrap_room", topo.FollowBootstrapRoom)
		if w := m.waitPrefill[reg.Addr]; w != nil {
			m.clearDeadlineLocked(&w.next)
			delete(m.waitPrefill, reg.Addr)
			for _, r := range sortedRooms(w.rooms) {
				if r.phase == PhaseWaitingPrefill {
					m.afterPrefillKnownLocked(r, inst, "T4")
				}
			}
		}
	}
	iv, mf := m.cfg.Timeouts.EffectiveHeartbeat()
	res.Mapping = mapping
	res.HeartbeatInterval, res.MaxFailures = iv, mf
	res.Registered, res.Expected = len(inst.ranks), inst.expected
	if rp := inst.plan.rankPlan(id.key()); rp != nil {
		for _, t := range rp.targets {
			if !slices.Contains(res.ServesDecodeTP, t.DecodeTP) {
				res.ServesDecodeTP = append(res.ServesDecodeTP, t.DecodeTP)
			}
		}
		res.Dummy = rp.dummy
		res.RequiredDstInfoNum = rp.requiredDstInfoNum
	} else {
		res.Dummy = true // addressed by no decode rank (CP ranks beyond 0, for instance)
	}
	res.Staging = inst.plan.staging
	return res, nil
}

// Heartbeat refreshes a registered rank. An unknown rank (never registered,
// or its instance was declared dead or replaced) is ErrPrefillNotFound: the
// rank must register again.
func (m *Manager) Heartbeat(rank RankID, instanceID string) (time.Duration, int, error) {
	m.mu.Lock()
	defer m.unlock()
	inst := m.prefills[rank.Addr]
	if inst == nil {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w (register again)", rank, ErrPrefillNotFound)
	}
	rk := inst.ranks[rank]
	if rk == nil {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w: this rank is not registered (register again)", rank, ErrPrefillNotFound)
	}
	if instanceID != "" && rk.instanceID != "" && instanceID != rk.instanceID {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w: instance_id %q is not the registered instance %q (a new process replaced it, or this one was replaced: register again)", rank, ErrPrefillNotFound, instanceID, rk.instanceID)
	}
	rk.lastSeen = m.clock.Now()
	rk.missed = 0
	iv, mf := m.cfg.Timeouts.EffectiveHeartbeat()
	return iv, mf, nil
}

// SilentRank is a registered prefill rank whose heartbeat is overdue.
type SilentRank struct {
	Rank RankID
	// Silent is the time since its last heartbeat (or its registration).
	Silent time.Duration
	// Missed is how many whole heartbeat intervals that is.
	Missed int
}

func (s SilentRank) String() string {
	return fmt.Sprintf("dp %d cp %d tp %d pp %d for %s", s.Rank.DP, s.Rank.CP, s.Rank.TP, s.Rank.PP, s.Silent.Round(100*time.Millisecond))
}

// silentRanks returns the ranks of an instance silent for at least least,
// longest silent first (then in rank order), at most limit of them, and how
// many there are in all. Liveness is per rank: every registered rank must
// heartbeat, since a room needs every required rank's KV.
//
// It keeps only the top limit while scanning, so a status of an instance
// with many silent ranks costs O(ranks × limit) time and O(limit) memory.
func (inst *prefillInstance) silentRanks(now time.Time, least, iv time.Duration, limit int) ([]SilentRank, int) {
	order := func(a, b SilentRank) int {
		if c := cmp.Compare(b.Silent, a.Silent); c != 0 {
			return c
		}
		return compareRank(a.Rank, b.Rank)
	}
	var top []SilentRank
	total := 0
	for _, rk := range inst.ranks {
		d := now.Sub(rk.lastSeen)
		if d < least {
			continue
		}
		total++
		s := SilentRank{Rank: rk.id, Silent: d, Missed: int(d / iv)}
		i, _ := slices.BinarySearchFunc(top, s, order)
		if i >= limit {
			continue
		}
		top = slices.Insert(top, i, s)
		if len(top) > limit {
			top = top[:limit]
		}
	}
	return top, total
}

func compareRank(a, b RankID) int {
	for _, d := range [...]int{a.DP - b.DP, a.PP - b.PP, a.CP - b.CP, a.TP - b.TP} {
		if d != 0 {
			return d
		}
	}
	return 0
}

func describeSilent(ranks []SilentRank, total int) string {
	parts := make([]string, 0, len(ranks)+1)
	for _, s := range ranks {
		parts = append(parts, s.String())
	}
	if more := total - len(ranks); more > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", more))
	}
	return strings.Join(parts, ", ")
}

// checkLiveness declares dead every instance with a rank silent for
// max_failures heartbeat intervals (SGLang T15). The rooms' failure, the log
// line and the metrics say which ranks went silent and for how long.
func (m *Manager) checkLiveness() {
	m.mu.Lock()
	defer m.unlock()
	iv, mf := m.cfg.Timeouts.EffectiveHeartbeat()
	limit := iv * time.Duration(mf)
	now := m.clock.Now()
	var dead []string
	for addr, inst := range m.prefills {
		lost := false
		for _, rk := range inst.ranks {
			silent := now.Sub(rk.lastSeen)
			if missed := int(silent / iv); missed > rk.missed {
				// Count each missed interval once, although checks run more often.
				rk.missed = missed
				m.obs.HeartbeatMissed(addr)
			}
			lost = lost || silent >= limit
		}
		if lost {
			dead = append(dead, addr)
		}
	}
	slices.Sort(dead)
	for _, addr := range dead {
		silent, total := m.prefills[addr].silentRanks(now, limit, iv, maxListedRanks)
		who := describeSilent(silent, total)
		n := m.countRoomsLocked(func(r *room) bool { return r.addr == addr && r.handingOff() })
		m.log.Warn("prefill instance lost: heartbeats stopped", "bootstrap_addr", addr, "rooms_affected", n,
			"silent_ranks", who, "silent_rank_count", total, "heartbeat_interval", iv, "heartbeat_max_failures", mf)
		m.killInstanceLocked(addr, FailurePrefillLost, fmt.Sprintf(
			"Lost connection with prefill instance (bootstrap_addr: %s), %d requests affected; silent ranks (no heartbeat within %d × %s): %s",
			addr, n, mf, iv, who))
		m.obs.PrefillLost(addr, n)
	}
}

// killInstanceLocked forgets an instance and fails its rooms that are still
// handing off; it returns how many failed.
func (m *Manager) killInstanceLocked(addr string, code FailureCode, msg string) int {
	n := m.failRoomsLocked(func(r *room) bool { return r.addr == addr && r.handingOff() }, Failure{Code: code, Message: msg})
	delete(m.prefills, addr)
	delete(m.bindings, addr)
	return n
}

func (m *Manager) countRoomsLocked(match func(*room) bool) int {
	n := 0
	for _, r := range m.rooms {
		if match(r) {
			n++
		}
	}
	return n
}

func (m *Manager) failRoomsLocked(match func(*room) bool, f Failure) int {
	var victims []*room
	for _, r := range m.rooms {
		if match(r) {
			victims = append(victims, r)
		}
	}
	slices.SortFunc(victims, func(a, b *room) int { return compareU64(a.id, b.id) })
	for _, r := range victims {
		m.failLocked(r, f)
	}
	return len(victims)
}

func compareU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func sortedRooms(set map[uint64]*room) []*room {
	out := make([]*room, 0, len(set))
	for _, r := range set {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b *room) int { return compareU64(a.id, b.id) })
	return out
}

// waitForPrefillLocked parks a room until its instance completes its
// registration, under SGLang's retry budget.
func (m *Manager) waitForPrefillLocked(r *room) {
	w := m.waitPrefill[r.addr]
	if w == nil {
		w = &addrWait{addr: r.addr, rooms: map[uint64]*room{}}
		m.waitPrefill[r.addr] = w
	}
	w.rooms[r.id] = r
	if !w.next.armed() {
		m.scheduleAttemptLocked(r.addr, w)
	}
}

func (m *Manager) scheduleAttemptLocked(addr string, w *addrWait) {
	if m.closed {
		return
	}
	m.setDeadlineLocked(&w.next, dlPrefillAttempt, m.clock.Now().Add(m.cfg.Timeouts.backoff(w.attempts)), 0, 0, w)
}

// prefillAttemptLocked is one check of an address's registration (one of SGLang's
// _ensure_prefill_info attempts).
func (m *Manager) prefillAttemptLocked(addr string, w *addrWait) {
	if m.waitPrefill[addr] != w {
		return
	}
	for id, r := range w.rooms {
		if r.phase != PhaseWaitingPrefill {
			delete(w.rooms, id)
		}
	}
	if len(w.rooms) == 0 {
		delete(m.waitPrefill, addr)
		return
	}
	w.attempts++
	if inst := m.prefills[addr]; inst != nil && inst.complete {
		delete(m.waitPrefill, addr)
		for _, r := range sortedRooms(w.rooms) {
			m.afterPrefillKnownLocked(r, inst, "T4")
		}
		return
	}
	if w.attempts >= m.cfg.Timeouts.PrefillInfoAttempts {
		delete(m.waitPrefill, addr)
		registered := 0
		if inst := m.prefills[addr]; inst != nil {
			registered = len(inst.ranks)
		}
		msg := fmt.Sprintf("Could not fetch prefill parallel info from %s after %d attempts", addr, w.attempts)
		if registered > 0 {
			msg += fmt.Sprintf(" (Prefill server not fully registered yet (%d workers registered).)", registered)
		}
		for _, r := range sortedRooms(w.rooms) {
			m.failLocked(r, Failure{Code: FailurePrefillUnavailable, Message: msg})
		}
		return
	}
	m.scheduleAttemptLocked(addr, w)
}

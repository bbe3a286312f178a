package registry

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// Config is what the registry checks and keeps instances against.
type Config struct {
	// Layout is the decode KV layout registrations are checked against and
	// mapped onto.
	Layout kvlayout.Layout
	// HeartbeatInterval and MaxFailures are the effective heartbeat policy
	// (after SGLang's floors): a rank silent for MaxFailures intervals
	// kills its instance.
	HeartbeatInterval time.Duration
	MaxFailures       int
	// ForceQuery is SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK: the
	// binding table is consulted even under follow_bootstrap_room.
	ForceQuery bool
	// BindingTTL is how long a BindRoom binding resolves its room.
	BindingTTL time.Duration
	// Now reads the clock; nil is time.Now.
	Now func() time.Time
	// LeaseLiveness: an instance's liveness is decided elsewhere (the
	// fleet's shared registry, where it is an etcd lease kept alive by
	// heartbeats to any daemon): CheckLiveness never loses an instance nor
	// counts missed heartbeats, and Status reports no silent ranks, since
	// the ranks may heartbeat to another daemon. Lose forgets an instance
	// when its lease ends.
	LeaseLiveness bool
}

// Registry holds the prefill instances known to one decode instance, their
// ranks' liveness and the DP-rank bindings. It is safe for concurrent use;
// it has its own mutex and calls nothing outside itself while holding it.
type Registry struct {
	cfg Config
	fp  kvlayout.Fingerprint // cfg.Layout's: what Compat checks registrations against

	mu        sync.Mutex
	instances map[string]*instance
	bindings  map[string]map[uint64]binding
	// lastCheck is when CheckLiveness last ran (New, before the first),
	// lastRecord when a heartbeat or registration was last recorded, and
	// quiet the longest stretch since lastCheck in which neither happened
	// (up to the last record; CheckLiveness adds the stretch since).
	lastCheck, lastRecord time.Time
	quiet                 time.Duration
}

// silence is how long the rank has been silent as liveness counts it: the
// time since its last heartbeat less the daemon's own stalls meanwhile.
func (rk *rank) silence(now time.Time) time.Duration {
	return now.Sub(rk.lastSeen) - rk.credit
}

// recordedLocked notes that a heartbeat or registration was served (a
// daemon that serves them is running: CheckLiveness).
func (g *Registry) recordedLocked(now time.Time) {
	g.quiet = max(g.quiet, now.Sub(g.lastSign()))
	g.lastRecord = now
}

// lastSign is when the daemon last showed it was running: the later of
// the last check and the last record.
func (g *Registry) lastSign() time.Time {
	if g.lastRecord.After(g.lastCheck) {
		return g.lastRecord
	}
	return g.lastCheck
}

// ChecksPerInterval is how often CheckLiveness is meant to run: every
// heartbeat interval / ChecksPerInterval (the Manager's ticker).
const ChecksPerInterval = 4

// New returns an empty registry.
func New(cfg Config) *Registry {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// Its creation is the first sign of the daemon running: a pause before
	// the first check is a stall too (CheckLiveness).
	now := cfg.Now()
	return &Registry{cfg: cfg, fp: cfg.Layout.Fingerprint(), instances: map[string]*instance{}, bindings: map[string]map[uint64]binding{}, lastCheck: now}
}

type instance struct {
	addr       string
	instanceID string
	topo       PrefillTopology
	pageSize   int
	dtype      string
	lbMethod   string
	httpPort   int
	ranks      map[RankID]*rank
	expected   int
	complete   bool
	plan       *Plan
}

type rank struct {
	id         RankID
	endpoint   string
	instanceID string
	lastSeen   time.Time
	// credit is the part of the time since lastSeen that the daemon itself
	// did not run (CheckLiveness): not the rank's silence.
	credit time.Duration
	missed int // heartbeat intervals missed since lastSeen, as counted so far
}

func (inst *instance) view() Instance {
	return Instance{Addr: inst.addr, Topology: inst.topo, Plan: inst.plan, Registered: len(inst.ranks), Expected: inst.expected, Complete: inst.complete}
}

func followsRoom(lbMethod string) bool {
	return lbMethod == "" || lbMethod == "follow_bootstrap_room"
}

// Checked is a registration that passed the checks that read no registry
// state (Check): compatibility with the decode layout, SGLang's rank
// mapping, the rank within its own layout.
type Checked struct {
	reg     Registration
	topo    PrefillTopology
	mapping []DecodeRankMapping
	id      RankID
}

// Check applies the checks of a registration that read no registry state,
// without the registry's lock (the caller need hold no lock either): the
// compatibility checks and the rank mapping, whose lists are the costly
// part of a registration.
func (g *Registry) Check(reg Registration) (Checked, error) {
	if err := g.checkCompat(reg); err != nil {
		return Checked{}, err
	}
	par := reg.Parallel
	dpSize, dpGroup := par.dp()
	topo := PrefillTopology{AttnTP: max(1, par.AttnTP), AttnCP: max(1, par.AttnCP), DP: dpSize, PP: max(1, par.PP),
		FollowBootstrapRoom: followsRoom(reg.LoadBalanceMethod), DSACacheLayerSplit: reg.DSACacheLayerSplit}
	mapping, err := g.Mapping(topo)
	if err != nil {
		return Checked{}, fmt.Errorf("%w: %v", ErrPrefillMismatch, err)
	}
	id := RankID{Addr: reg.Addr, DP: dpGroup, CP: par.AttnCPRank, TP: par.AttnTPRank, PP: par.PPRank}
	if err := checkRankInLayout(par, id, topo); err != nil {
		return Checked{}, err
	}
	return Checked{reg: reg, topo: topo, mapping: mapping, id: id}, nil
}

// Register is Check, then Record.
func (g *Registry) Register(reg Registration) (RegistrationResult, []Event, error) {
	c, err := g.Check(reg)
	if err != nil {
		return RegistrationResult{}, nil, err
	}
	return g.Record(c)
}

// Record registers one checked prefill rank. It is idempotent per rank; a
// new endpoint for a known rank (RankReplaced), or a new instance id for a
// known address (InstanceReplaced), replaces the old registration. The
// events say what the rooms must do, in order; an error (a layout that
// contradicts the instance's first registration) changes nothing and comes
// with no event.
func (g *Registry) Record(c Checked) (RegistrationResult, []Event, error) {
	if c.mapping == nil { // the zero Checked: every checked registration has a mapping
		return RegistrationResult{}, nil, errors.New("registry: Record of a registration that did not pass Check")
	}
	reg, topo, mapping, id := c.reg, c.topo, c.mapping, c.id
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.cfg.Now()
	res := RegistrationResult{}
	var evs []Event
	inst := g.instances[reg.Addr]
	if inst != nil && reg.InstanceID != "" && inst.instanceID != "" && reg.InstanceID != inst.instanceID {
		evs = append(evs, Event{Kind: InstanceReplaced, Addr: reg.Addr, Message: fmt.Sprintf(
			"prefill instance %s was replaced (instance id %s -> %s)", reg.Addr, inst.instanceID, reg.InstanceID)})
		g.forgetLocked(reg.Addr)
		res.Replaced = true
		inst = nil
	}
	if inst != nil && inst.topo != topo {
		return RegistrationResult{}, nil, fmt.Errorf("%w: rank %s reports attn_tp=%d attn_cp=%d dp=%d pp=%d load_balance_method=%q, but %s registered attn_tp=%d attn_cp=%d dp=%d pp=%d follow_bootstrap_room=%v first; restart the instance with one layout (or with a new instance id)",
			ErrPrefillMismatch, id, topo.AttnTP, topo.AttnCP, topo.DP, topo.PP, reg.LoadBalanceMethod, reg.Addr,
			inst.topo.AttnTP, inst.topo.AttnCP, inst.topo.DP, inst.topo.PP, inst.topo.FollowBootstrapRoom)
	}
	if inst == nil {
		l := g.cfg.Layout
		inst = &instance{
			addr: reg.Addr, instanceID: reg.InstanceID, topo: topo, pageSize: reg.PageSize, dtype: reg.KVDType,
			lbMethod: reg.LoadBalanceMethod, httpPort: reg.HTTPPort, ranks: map[RankID]*rank{},
			expected: rankCount(topo),
			plan:     ranks.NewPlan(topo, l.AttnTP, l.TotalKVHeads, l.IsMLA, l.Kind == kvlayout.KindHybridMLA, l.Staging),
		}
		g.instances[reg.Addr] = inst
	}
	if inst.instanceID == "" {
		inst.instanceID = reg.InstanceID
	}
	if old := inst.ranks[id]; old != nil && old.endpoint != reg.Endpoint {
		res.Replaced = true
		evs = append(evs, Event{Kind: RankReplaced, Addr: reg.Addr, Rank: id, Message: fmt.Sprintf(
			"Prefill server with bootstrap_addr: %s is healthy before, but now it is down: rank %s re-registered with a new endpoint (%s -> %s). Requests bound to the old registration have been marked as failed.",
			reg.Addr, id, old.endpoint, reg.Endpoint)})
	}
	inst.ranks[id] = &rank{id: id, endpoint: reg.Endpoint, instanceID: reg.InstanceID, lastSeen: now}
	g.recordedLocked(now)
	evs = append(evs, Event{Kind: RankRegistered, Addr: reg.Addr, Rank: id, Replaced: res.Replaced})
	if !inst.complete && len(inst.ranks) >= inst.expected {
		inst.complete = true
		inst.plan.Enumerate() // bounded by the ranks registered (every required rank is one)
		evs = append(evs, Event{Kind: InstanceComplete, Addr: reg.Addr, Instance: inst.view()})
	}
	res.Mapping = mapping
	res.HeartbeatInterval, res.MaxFailures = g.cfg.HeartbeatInterval, g.cfg.MaxFailures
	res.Registered, res.Expected = len(inst.ranks), inst.expected
	if rp := inst.plan.Rank(id.Key()); rp != nil {
		for _, t := range rp.Targets() {
			if !slices.Contains(res.ServesDecodeTP, t.DecodeTP) {
				res.ServesDecodeTP = append(res.ServesDecodeTP, t.DecodeTP)
			}
		}
		res.Dummy = rp.Dummy()
		res.RequiredDstInfoNum = rp.RequiredDstInfoNum()
	} else {
		res.Dummy = true // addressed by no decode rank (CP ranks beyond 0, for instance)
	}
	res.Staging = inst.plan.Staging()
	return res, evs, nil
}

// forgetLocked drops an instance and its bindings.
func (g *Registry) forgetLocked(addr string) {
	delete(g.instances, addr)
	delete(g.bindings, addr)
}

// Heartbeat refreshes a registered rank and returns the heartbeat policy.
// An unknown rank (never registered, or its instance was declared dead or
// replaced) is ErrPrefillNotFound: the rank must register again.
func (g *Registry) Heartbeat(id RankID, instanceID string) (time.Duration, int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[id.Addr]
	if inst == nil {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w (register again)", id, ErrPrefillNotFound)
	}
	rk := inst.ranks[id]
	if rk == nil {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w: this rank is not registered (register again)", id, ErrPrefillNotFound)
	}
	if instanceID != "" && rk.instanceID != "" && instanceID != rk.instanceID {
		return 0, 0, fmt.Errorf("heartbeat from %s: %w: instance_id %q is not the registered instance %q (a new process replaced it, or this one was replaced: register again)", id, ErrPrefillNotFound, instanceID, rk.instanceID)
	}
	rk.lastSeen, rk.credit, rk.missed = g.cfg.Now(), 0, 0
	g.recordedLocked(rk.lastSeen)
	return g.cfg.HeartbeatInterval, g.cfg.MaxFailures, nil
}

// Touch counts as a heartbeat of every registered rank of the instance at
// addr. It reports false when the instance is not registered, or was
// replaced by another instance id than instanceID (when both are set).
func (g *Registry) Touch(addr, instanceID string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil || (instanceID != "" && inst.instanceID != "" && inst.instanceID != instanceID) {
		return false
	}
	now := g.cfg.Now()
	for _, rk := range inst.ranks {
		rk.lastSeen, rk.credit, rk.missed = now, 0, 0
	}
	g.recordedLocked(now)
	return true
}

// Instance returns a view of the instance at addr; ok is false when no rank
// of addr is registered.
func (g *Registry) Instance(addr string) (Instance, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil {
		return Instance{}, false
	}
	return inst.view(), true
}

// Topology returns the topology of the instance at addr (zero when none).
func (g *Registry) Topology(addr string) PrefillTopology {
	g.mu.Lock()
	defer g.mu.Unlock()
	if inst := g.instances[addr]; inst != nil {
		return inst.topo
	}
	return PrefillTopology{}
}

// Info returns what the first registration of the instance at addr set
// (SGLang's first-PUT-wins fields) and how many ranks registered; ok is
// false when no rank of addr is registered.
func (g *Registry) Info(addr string) (PrefillServerInfo, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil {
		return PrefillServerInfo{}, false
	}
	return PrefillServerInfo{Topology: inst.topo, PageSize: inst.pageSize, KVDType: inst.dtype, HTTPPort: inst.httpPort,
		InstanceID: inst.instanceID, Registered: len(inst.ranks), Expected: inst.expected, Complete: inst.complete}, true
}

// RankEndpoint returns the endpoint id registered with, and whether its
// instance is complete; ok is false when the rank is not registered.
func (g *Registry) RankEndpoint(id RankID) (endpoint string, complete, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[id.Addr]
	if inst == nil {
		return "", false, false
	}
	rk := inst.ranks[id]
	if rk == nil {
		return "", inst.complete, false
	}
	return rk.endpoint, inst.complete, true
}

// Addrs lists the addresses of every known instance, in no order.
func (g *Registry) Addrs() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]string, 0, len(g.instances))
	for a := range g.instances {
		out = append(out, a)
	}
	return out
}

// RankRegistered reports whether id is a registered rank of a complete
// instance at its address; an instance still registering (or unknown)
// reports true: nothing is known to refuse yet.
func (g *Registry) RankRegistered(id RankID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[id.Addr]
	return inst == nil || !inst.complete || inst.ranks[id] != nil
}

// Status lists every known instance, in no particular order.
func (g *Registry) Status() []InstanceStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.cfg.Now()
	interval := g.cfg.HeartbeatInterval
	out := make([]InstanceStatus, 0, len(g.instances))
	for _, p := range g.instances {
		ps := InstanceStatus{Addr: p.addr, InstanceID: p.instanceID, Registered: len(p.ranks), Expected: p.expected, Topology: p.topo}
		for _, rk := range p.ranks {
			if rk.lastSeen.After(ps.LastHeartbeat) || ps.LastHeartbeat.IsZero() {
				ps.LastHeartbeat = rk.lastSeen
			}
			ps.MissedHeartbeats = max(ps.MissedHeartbeats, int(now.Sub(rk.lastSeen)/interval))
		}
		if g.cfg.LeaseLiveness {
			ps.MissedHeartbeats = 0 // the ranks may heartbeat to another daemon of the fleet
		} else {
			ps.SilentRanks, ps.SilentRankCount = p.silentRanks(now, interval, interval, MaxListedRanks)
		}
		out = append(out, ps)
	}
	return out
}

// silentRanks returns the ranks of an instance silent for at least least,
// longest silent first (then in rank order), at most limit of them, and how
// many there are in all. Liveness is per rank: every registered rank must
// heartbeat, since a room needs every required rank's KV.
//
// It keeps only the top limit while scanning, so a status of an instance
// with many silent ranks costs O(ranks × limit) time and O(limit) memory.
func (inst *instance) silentRanks(now time.Time, least, iv time.Duration, limit int) ([]SilentRank, int) {
	order := func(a, b SilentRank) int {
		if c := cmp.Compare(b.Silent, a.Silent); c != 0 {
			return c
		}
		return compareRank(a.Rank, b.Rank)
	}
	var top []SilentRank
	total := 0
	for _, rk := range inst.ranks {
		// Selected as liveness counts silence (less the daemon's own
		// stalls), shown as the time since the rank's last heartbeat.
		if rk.silence(now) < least {
			continue
		}
		d := now.Sub(rk.lastSeen)
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

// CheckLiveness counts the heartbeat intervals each rank newly missed
// (HeartbeatMissed, each interval once although checks run more often) and
// forgets every instance with a rank silent for MaxFailures intervals
// (InstanceLost, SGLang T15, in address order), with its bindings.
//
// A daemon that did not run (paused: SIGSTOP, a frozen VM or container, a
// clock jump) cannot tell whether its prefills were silent meanwhile: their
// heartbeats may wait in its sockets. Its signs of running are the checks
// (every quarter interval) and the heartbeats and registrations it serves;
// a stretch of more than a heartbeat interval since the previous check with
// none of them (the pause: the beats queued meanwhile are served as it
// resumes, before or after this check) counts, less one check period, as
// the daemon's own stall, not the ranks' silence: each rank is credited
// with it (as etcd's lessor extends every lease when a new leader takes
// over after a gap). The credit counts for liveness only: Status shows the
// real last heartbeat. A check loop that was merely late while heartbeats
// were served credits nothing, and a rank that is really gone is found once
// it is silent for MaxFailures intervals of the daemon's running time.
func (g *Registry) CheckLiveness() []Event {
	if g.cfg.LeaseLiveness {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	iv, mf := g.cfg.HeartbeatInterval, g.cfg.MaxFailures
	limit := iv * time.Duration(mf)
	now := g.cfg.Now()
	period := iv / ChecksPerInterval
	// A stall: more than an interval without a check or a record (a paused
	// process serves no heartbeat; the ones waiting in its sockets come as
	// it resumes). A check loop merely late while heartbeats were being
	// served is not.
	quiet := max(g.quiet, now.Sub(g.lastSign()))
	if quiet > iv {
		stall := quiet - period
		for _, inst := range g.instances {
			for _, rk := range inst.ranks {
				rk.credit = min(rk.credit+stall, now.Sub(rk.lastSeen))
				rk.missed = min(rk.missed, int(rk.silence(now)/iv))
			}
		}
	}
	g.lastCheck, g.quiet = now, 0
	var evs []Event
	var dead []string
	for addr, inst := range g.instances {
		lost := false
		missedNow := 0
		for _, rk := range inst.ranks {
			silent := rk.silence(now)
			if missed := int(silent / iv); missed > rk.missed {
				// Count each missed interval once, although checks run more often.
				rk.missed = missed
				missedNow++
			}
			lost = lost || silent >= limit
		}
		if missedNow > 0 {
			evs = append(evs, Event{Kind: HeartbeatMissed, Addr: addr, Count: missedNow})
		}
		if lost {
			dead = append(dead, addr)
		}
	}
	slices.Sort(dead)
	for _, addr := range dead {
		silent, total := g.instances[addr].silentRanks(now, limit, iv, MaxListedRanks)
		evs = append(evs, Event{Kind: InstanceLost, Addr: addr, Silent: silent, SilentTotal: total, Interval: iv, MaxFailures: mf})
		g.forgetLocked(addr)
	}
	return evs
}

// Precheck reports whether Record would refuse c because of what is
// already registered (a layout that contradicts the instance's first
// registration, when the instance id is the same), without recording
// anything: the fleet publishes a registration only once this daemon would
// accept it.
func (g *Registry) Precheck(c Checked) error {
	if c.mapping == nil {
		return errors.New("registry: Precheck of a registration that did not pass Check")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[c.reg.Addr]
	if inst == nil || (c.reg.InstanceID != "" && inst.instanceID != "" && c.reg.InstanceID != inst.instanceID) {
		return nil
	}
	if inst.topo != c.topo {
		return fmt.Errorf("%w: rank %s reports attn_tp=%d attn_cp=%d dp=%d pp=%d load_balance_method=%q, but %s registered attn_tp=%d attn_cp=%d dp=%d pp=%d follow_bootstrap_room=%v first; restart the instance with one layout (or with a new instance id)",
			ErrPrefillMismatch, c.id, c.topo.AttnTP, c.topo.AttnCP, c.topo.DP, c.topo.PP, c.reg.LoadBalanceMethod, c.reg.Addr,
			inst.topo.AttnTP, inst.topo.AttnCP, inst.topo.DP, inst.topo.PP, inst.topo.FollowBootstrapRoom)
	}
	return nil
}

// Known reports whether reg's rank is registered with the same endpoint
// and instance id: recording it again would change nothing (the fleet
// skips the registrations it already applied).
func (g *Registry) Known(reg Registration) bool {
	par := reg.Parallel
	_, dpGroup := par.dp()
	id := RankID{Addr: reg.Addr, DP: dpGroup, CP: par.AttnCPRank, TP: par.AttnTPRank, PP: par.PPRank}
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[reg.Addr]
	if inst == nil || inst.instanceID != reg.InstanceID {
		return false
	}
	rk := inst.ranks[id]
	return rk != nil && rk.endpoint == reg.Endpoint
}

// Lose forgets the instance at addr and its bindings because its liveness
// ended elsewhere (LeaseLiveness: its fleet lease expired), and returns
// InstanceLost with Message, the reason, which LostMessage words. An
// unknown addr, or an instance whose id is not instanceID (a newer one
// registered meanwhile; "" matches any), returns nothing.
func (g *Registry) Lose(addr, instanceID, reason string) []Event {
	g.mu.Lock()
	defer g.mu.Unlock()
	inst := g.instances[addr]
	if inst == nil || (instanceID != "" && inst.instanceID != "" && inst.instanceID != instanceID) {
		return nil
	}
	g.forgetLocked(addr)
	return []Event{{Kind: InstanceLost, Addr: addr, Message: reason}}
}

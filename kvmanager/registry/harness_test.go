package registry

import (
	"fmt"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// TestMain: the registry starts no goroutine; goleak keeps it so.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// The harness is one Registry over a decode layout, with the room manager's
// default policy (heartbeat 5 s × 2, bindings for 120 s). Tests that read
// the clock run inside a synctest bubble: the registry's default clock,
// time.Now, is the bubble's virtual clock there.

const (
	addrA = "10.0.0.1:8998"
	addrB = "10.0.0.2:8998"
)

type harness struct {
	t   *testing.T
	g   *Registry
	dec kvlayout.Config
}

type option func(*kvlayout.Config, *Config)

// withDecode adjusts the decode configuration (nil: the default).
func withDecode(f func(*kvlayout.Config)) option {
	return func(c *kvlayout.Config, _ *Config) {
		if f != nil {
			f(c)
		}
	}
}

// withForceQuery sets force_query.
func withForceQuery(on bool) option {
	return func(_ *kvlayout.Config, c *Config) { c.ForceQuery = on }
}

// mlaDecode switches the decode pool to an MLA kind.
func mlaDecode(kind kvlayout.Kind) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		c.Pool.Kind = kind
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	}
}

func newHarness(t *testing.T, opts ...option) *harness {
	t.Helper()
	dec := kvlayout.DefaultConfig()
	cfg := Config{HeartbeatInterval: 5 * time.Second, MaxFailures: 2, BindingTTL: 120 * time.Second}
	for _, f := range opts {
		f(&dec, &cfg)
	}
	if err := dec.Validate(); err != nil {
		t.Fatalf("decode config does not validate: %v", err)
	}
	cfg.Layout = dec.Layout()
	return &harness{t: t, g: New(cfg), dec: dec}
}

func bubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, f)
}

func advance(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

// prefill describes a prefill instance to register.
type prefill struct {
	addr       string
	tp, dp, pp int
	cp         int
	lb         string // load_balance_method; "" = follow_bootstrap_room
	instanceID string
	endpoint   string // endpoint prefix; "" = "tcp://rank"
}

func (in prefill) sizes() (tp, dp, pp, cp int) {
	return max(1, in.tp), max(1, in.dp), max(1, in.pp), max(1, in.cp)
}

// registration builds one rank's registration with the decode side's page
// size and dtype.
func (h *harness) registration(in prefill, dp, cp, tp, pp int) Registration {
	TP, DP, PP, CP := in.sizes()
	par := ParallelInfo{AttnTP: TP, AttnTPRank: tp, AttnCP: CP, AttnCPRank: cp, PP: PP, PPRank: pp, SystemDP: 1, AttnDP: DP, AttnDPRank: dp}
	ep := in.endpoint
	if ep == "" {
		ep = "tcp://rank"
	}
	return Registration{
		Addr: in.addr, Endpoint: fmt.Sprintf("%s-%d-%d-%d-%d", ep, dp, cp, tp, pp), InstanceID: in.instanceID,
		Parallel: par, PageSize: h.dec.Pool.PageSize, KVDType: h.dec.Pool.DType, LoadBalanceMethod: in.lb, HTTPPort: 30000,
	}
}

// ranksOf lists every rank of an instance, DP-major.
func ranksOf(in prefill) []RankID {
	TP, DP, PP, CP := in.sizes()
	var out []RankID
	for dp := range DP {
		for cp := range CP {
			for tp := range TP {
				for pp := range PP {
					out = append(out, RankID{Addr: in.addr, DP: dp, CP: cp, TP: tp, PP: pp})
				}
			}
		}
	}
	return out
}

// register registers every rank of an instance and returns the events of
// the last registration (the one that completes it).
func (h *harness) register(in prefill) []Event {
	h.t.Helper()
	var res RegistrationResult
	var evs []Event
	for _, rk := range ranksOf(in) {
		var err error
		res, evs, err = h.g.Register(h.registration(in, rk.DP, rk.CP, rk.TP, rk.PP))
		if err != nil {
			h.t.Fatalf("Register(%s) = %v", rk, err)
		}
	}
	if res.Registered != res.Expected {
		h.t.Fatalf("after registering every rank of %s: %d of %d registered", in.addr, res.Registered, res.Expected)
	}
	return evs
}

// allocated returns how many bytes f allocated (runtime.MemStats.TotalAlloc:
// every allocation, freed or not). Inside a bubble nothing else runs.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// kinds lists the kinds of events, in order.
func kinds(evs []Event) []EventKind {
	out := make([]EventKind, len(evs))
	for i, e := range evs {
		out[i] = e.Kind
	}
	return out
}

// lookup is LookupDPRanks in the room manager's shape: resolved, unresolved.
func (h *harness) lookup(addr string, rooms []uint64, hints map[uint64]int) ([]DPResolution, []uint64, error) {
	lk, err := h.g.LookupDPRanks(addr, rooms, hints)
	return lk.Resolved, lk.Unresolved, err
}

package prealloc

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// testConfig is a validated configuration of the given kind: pageSize,
// totalPages, reqSlots request slots with no pre-alloc rows, R = 512,
// CLIP = 4096, FIFO with SGLang's strict head-of-line admission
// (admission.max_bypass 0), no claim timeout.
func testConfig(kind kvlayout.Kind, pageSize int, totalPages int64, reqSlots int) kvlayout.Config {
	c := kvlayout.DefaultConfig()
	c.Pool.Kind = kind
	c.Pool.PageSize = pageSize
	c.Pool.TotalTokens = 0
	c.Pool.TotalPages = totalPages
	c.Pool.RequestSlots = reqSlots
	c.Pool.PreAllocSlots = 0
	c.Admission.ClaimTimeout = 0
	c.Admission.MaxBypass = 0
	switch kind {
	case kvlayout.KindMLA, kvlayout.KindHybridMLA:
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	case kvlayout.KindHybridSWA:
		c.Pool.SWA = kvlayout.SWAConfig{Window: 256, TotalTokens: 1024}
	case kvlayout.KindHybridLinear:
		c.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 3 * reqSlots, ExtraBuffer: true, PingPong: 2, StateBytes: 1 << 20}
	}
	return c
}

// newLedger builds a ledger from cfg, which must pass Validate unless
// unvalidated is set (tests that exercise pools Validate would refuse).
func newLedger(t testing.TB, cfg kvlayout.Config, unvalidated bool) *Ledger {
	t.Helper()
	if !unvalidated {
		if err := cfg.Validate(); err != nil {
			t.Fatalf("test config does not validate: %v", err)
		}
	}
	l, err := NewLedger(cfg, 0)
	if err != nil {
		t.Fatalf("NewLedger: %v", err)
	}
	return l
}

func checkInv(t testing.TB, l *Ledger) {
	t.Helper()
	if err := l.CheckInvariants(); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// assertFull fails unless every pool is entirely free and no room is left.
func assertFull(t testing.TB, l *Ledger) {
	t.Helper()
	checkInv(t, l)
	s := l.Stats()
	for name, r := range map[string]ResourceStats{"pages": s.Pages, "req slots": s.ReqSlots, "metadata slots": s.MetaSlots, "mamba slots": s.MambaSlots, "swa pages": s.SWAPages} {
		if r.Used != 0 || r.Free != r.Total || r.Draining != 0 {
			t.Errorf("%s not back to full: %+v", name, r)
		}
	}
	rooms := s.Waiting + s.Ready + s.Admitted + s.Claimed + s.Resumed + s.Running + s.Retracted + s.Held + s.Draining
	if rooms != 0 || s.Retractable != 0 {
		t.Errorf("rooms left: %+v", s)
	}
}

func mustNil(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func mustIs(t testing.TB, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got %v, want %v", what, err, target)
	}
}

func req(room uint64, prompt, maxNew int) Request {
	return Request{Room: room, RID: "rid-" + itoa(room), PromptLen: prompt, MaxNewTokens: maxNew}
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

// admitRooms runs one pass and returns the admitted room ids in order and
// the block reason.
func admitRooms(t testing.TB, l *Ledger) ([]uint64, BlockReason, []Admission) {
	t.Helper()
	adm, reason := l.Admit()
	ids := make([]uint64, 0, len(adm))
	for _, a := range adm {
		ids = append(ids, a.Room)
	}
	checkInv(t, l)
	return ids, reason, adm
}

// runRoom takes r from enqueue to running with output tokens, through a pass
// that must admit exactly r.
func runRoom(t testing.TB, l *Ledger, r Request, output int) {
	t.Helper()
	mustNil(t, "enqueue", l.Enqueue(r))
	mustNil(t, "set ready", l.SetReady(r.Room))
	ids, _, _ := admitRooms(t, l)
	if diff := cmp.Diff([]uint64{r.Room}, ids); diff != "" {
		t.Fatalf("runRoom admit (-want +got):\n%s", diff)
	}
	mustNil(t, "claim", l.Claim(r.Room))
	mustNil(t, "start running", l.StartRunning(r.Room))
	if output > 0 {
		if _, err := l.UpdateRunning(r.Room, output); err != nil {
			t.Fatalf("update running: %v", err)
		}
	}
	checkInv(t, l)
}

func releaseAll(t testing.TB, l *Ledger, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		mustNil(t, "release", l.Release(id))
	}
}

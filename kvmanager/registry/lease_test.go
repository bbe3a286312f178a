package registry

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

func withLeaseLiveness() option {
	return func(_ *kvlayout.Config, c *Config) { c.LeaseLiveness = true }
}

// TestLeaseLivenessNeverLoses: with the fleet's lease deciding liveness, a
// rank silent far beyond max_failures intervals is neither lost nor counted
// as missing (it may heartbeat to another daemon); Lose forgets the
// instance and words the rooms' failure by its reason.
func TestLeaseLivenessNeverLoses(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withLeaseLiveness())
		in := prefill{addr: addrA, tp: 2, instanceID: "i1"}
		h.register(in)
		advance(time.Minute)
		if evs := h.g.Lose(addrA, "i0", "an older instance's lease"); len(evs) != 0 {
			t.Fatalf("Lose of another instance id = %v, want nothing (a newer instance is registered)", kinds(evs))
		}
		if evs := h.g.CheckLiveness(); len(evs) != 0 {
			t.Fatalf("CheckLiveness under lease liveness = %v, want no event", kinds(evs))
		}
		st := h.g.Status()
		if len(st) != 1 || st[0].MissedHeartbeats != 0 || st[0].SilentRankCount != 0 {
			t.Fatalf("Status = %+v, want one instance with no missed heartbeats", st)
		}
		evs := h.g.Lose(addrA, "i1", "its fleet lease expired")
		if len(evs) != 1 || evs[0].Kind != InstanceLost {
			t.Fatalf("Lose = %v, want one InstanceLost", kinds(evs))
		}
		msg := evs[0].LostMessage(3)
		if !strings.Contains(msg, "3 requests affected") || !strings.Contains(msg, "its fleet lease expired") || !strings.Contains(msg, addrA) {
			t.Fatalf("LostMessage = %q", msg)
		}
		if _, ok := h.g.Instance(addrA); ok {
			t.Fatal("the instance is still known after Lose")
		}
		if evs := h.g.Lose(addrA, "", "again"); len(evs) != 0 {
			t.Fatalf("Lose of an unknown instance = %v, want nothing", kinds(evs))
		}
	})
}

// TestHeartbeatLivenessStillLoses: without LeaseLiveness the same silence
// loses the instance (the memory registry's rule is unchanged).
func TestHeartbeatLivenessStillLoses(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t)
		h.register(prefill{addr: addrA})
		// The daemon runs its checks every quarter interval (a minute
		// without any would be its own stall, CheckLiveness).
		var evs []Event
		for range 48 {
			advance(1250 * time.Millisecond)
			if evs = h.g.CheckLiveness(); len(evs) > 0 && evs[len(evs)-1].Kind == InstanceLost {
				break
			}
		}
		if k := kinds(evs); len(k) == 0 || k[len(k)-1] != InstanceLost {
			t.Fatalf("CheckLiveness = %v, want InstanceLost last", k)
		}
	})
}

// TestPrecheckAndKnown: Precheck refuses what Record would (a layout that
// contradicts the instance's first registration) and records nothing;
// Known is true only for the exact registration recorded.
func TestPrecheckAndKnown(t *testing.T) {
	h := newHarness(t)
	in := prefill{addr: addrA, tp: 2, instanceID: "i1"}
	reg := h.registration(in, 0, 0, 0, 0)
	if h.g.Known(reg) {
		t.Fatal("Known before any registration")
	}
	if _, _, err := h.g.Register(reg); err != nil {
		t.Fatal(err)
	}
	if !h.g.Known(reg) {
		t.Fatal("Known is false for the registration just recorded")
	}
	moved := reg
	moved.Endpoint = "tcp://elsewhere"
	if h.g.Known(moved) {
		t.Fatal("Known is true for a new endpoint")
	}
	other := reg
	other.InstanceID = "i2"
	if h.g.Known(other) {
		t.Fatal("Known is true for a new instance id")
	}
	bad := h.registration(prefill{addr: addrA, tp: 4, instanceID: "i1"}, 0, 0, 1, 0)
	c, err := h.g.Check(bad)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.Precheck(c); !errors.Is(err, ErrPrefillMismatch) {
		t.Fatalf("Precheck of a contradicting layout = %v, want ErrPrefillMismatch", err)
	}
	if info, _ := h.g.Info(addrA); info.Registered != 1 || info.Topology.AttnTP != 2 {
		t.Fatalf("Precheck changed the registry: %+v", info)
	}
	// A new instance id may bring a new layout: it replaces the instance.
	repl := h.registration(prefill{addr: addrA, tp: 4, instanceID: "i2"}, 0, 0, 1, 0)
	c, err = h.g.Check(repl)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.Precheck(c); err != nil {
		t.Fatalf("Precheck of a replacing instance = %v, want nil", err)
	}
	if err := h.g.Precheck(Checked{}); err == nil {
		t.Fatal("Precheck of the zero Checked succeeded")
	}
}

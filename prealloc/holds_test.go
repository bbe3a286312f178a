package prealloc

import (
	"errors"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
)

func newHolds(t *testing.T, cfg kvlayout.Config) *Holds {
	t.Helper()
	cfg.Pool.Owner = kvlayout.OwnerEngine
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h, err := NewHolds(cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestHoldsStateTypes: a declaration names one entry per state type of the
// pool's kind — none for a pool without, the Mamba slots of a
// hybrid-linear pool, the SWA pages of a hybrid-swa one — each index in
// its pool's range, once; a slot another room holds is refused naming it
// and the holder; nothing changes on a refusal, and Release frees it all.
func TestHoldsStateTypes(t *testing.T) {
	mamba := func(idx ...int32) kvlayout.StateIndices {
		return kvlayout.StateIndices{Type: kvlayout.StateMamba, Indices: idx}
	}
	swa := func(idx ...int32) kvlayout.StateIndices {
		return kvlayout.StateIndices{Type: kvlayout.StateSWA, Indices: idx}
	}
	t.Run("gqa", func(t *testing.T) {
		h := newHolds(t, testConfig(kvlayout.KindGQA, 16, 64, 4))
		if err := h.Check(1, Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{mamba(0)}}); !isInvalid(err, "state[0].type", "its state types: none") {
			t.Errorf("Mamba slots on a GQA pool = %v; want state[0].type refused", err)
		}
		if err := h.Check(1, Declared{Pages: []int32{0}}); err != nil {
			t.Errorf("a GQA declaration without state = %v", err)
		}
	})
	t.Run("hybrid-linear", func(t *testing.T) {
		cfg := testConfig(kvlayout.KindHybridLinear, 16, 64, 4) // 12 Mamba slots
		h := newHolds(t, cfg)
		for _, tc := range []struct {
			d     Declared
			field string
		}{
			{Declared{Pages: []int32{0}}, "state"},
			{Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{swa(0)}}, "state"},
			{Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{mamba(12)}}, "state[0].indices[0]"},
			{Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{mamba(3, 3)}}, "state[0].indices[1]"},
		} {
			if err := h.Declare(1, tc.d); !isInvalid(err, tc.field, "") {
				t.Errorf("Declare(%+v) = %v; want %s refused", tc.d, err, tc.field)
			}
		}
		if st := h.Stats(); st.Held != 0 {
			t.Fatalf("refused declarations held %+v", st)
		}
		if err := h.Declare(1, Declared{Pages: []int32{0, 1}, MetadataSlot: 0, State: []kvlayout.StateIndices{mamba(4, 5)}}); err != nil {
			t.Fatal(err)
		}
		err := h.Declare(2, Declared{Pages: []int32{2}, MetadataSlot: 1, State: []kvlayout.StateIndices{mamba(5)}})
		var he *HeldError
		if !errors.As(err, &he) || he.What != "MAMBA slot" || he.Index != 5 || he.Holder != 1 {
			t.Fatalf("declaring room 1's Mamba slot 5 = %v; want a HeldError naming it and room 1", err)
		}
		if err := h.Release(1, true); err != nil {
			t.Fatal(err)
		}
		if err := h.Declare(2, Declared{Pages: []int32{0}, MetadataSlot: 0, State: []kvlayout.StateIndices{mamba(5)}}); err != nil {
			t.Fatalf("declaring room 1's slot once released = %v", err)
		}
	})
	t.Run("hybrid-swa", func(t *testing.T) {
		h := newHolds(t, testConfig(kvlayout.KindHybridSWA, 16, 64, 4)) // 1024 SWA tokens: 64 SWA pages
		if err := h.Declare(1, Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{swa(64)}}); !isInvalid(err, "state[0].indices[0]", "outside the pool's 64") {
			t.Errorf("SWA page 64 of 64 = %v", err)
		}
		if err := h.Declare(1, Declared{Pages: []int32{0}, State: []kvlayout.StateIndices{swa(63)}}); err != nil {
			t.Errorf("SWA page 63 = %v", err)
		}
	})
}

func isInvalid(err error, field, msg string) bool {
	var inv *kvlayout.Invalid
	return errors.As(err, &inv) && inv.Field == field && strings.Contains(inv.Msg, msg)
}

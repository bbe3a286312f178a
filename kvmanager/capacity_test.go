package kvmanager

import (
	"testing"
	"time"
)

// TestCapacityFromTheLedger: the capacity figures follow the ledger: an
// empty pool is all free; a room waiting for its prefill counts in the
// queue; once admitted, its pages and the decode reservation R of an
// active room are no longer free; the resync wait says "resync".
func TestCapacityFromTheLedger(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(smallPool(128)))
		page := int64(h.dec.Pool.PageSize)
		r := int64(h.dec.Admission.ReservedDecodeTokens)
		slots := h.stats(0).ReqSlots.Total
		c := h.m.Capacity()
		if len(c) != 1 {
			t.Fatalf("Capacity() has %d shards, want 1", len(c))
		}
		want := ShardCapacity{Shard: 0, PageSize: int(page), TokensTotal: 128 * page, PagesTotal: 128, TokensFree: 128 * page, PagesFree: 128,
			ReqSlotsTotal: slots, ReqSlotsFree: slots, BlockedBy: "none", ReservedDecodeTokens: int(r)}
		if c[0] != want {
			t.Fatalf("empty shard: %+v, want %+v", c[0], want)
		}

		h.open(addrA, 1) // prompt 1000, max_new 128: its prefill is not registered yet
		if c := h.m.Capacity()[0]; c.QueueDepth != 1 || c.TokensFree != 128*page {
			t.Fatalf("a room waiting for its prefill: %+v, want queue depth 1 and the pool free", c)
		}
		h.register(instance{addr: addrA})
		h.wantPhase(1, PhaseAdmitted)
		pages := (1000 + page - 1) / page // fill_len 1000 rounded up to pages
		want.TokensFree = (128-pages)*page - r
		want.PagesFree = want.TokensFree / page
		want.ReqSlotsFree = slots - 1
		if c := h.m.Capacity()[0]; c != want {
			t.Fatalf("one room admitted: %+v, want %+v", c, want)
		}
		if free := h.stats(0).Pages.Free; free != 128-pages {
			t.Fatalf("ledger free pages %d, want %d", free, 128-pages)
		}
	})
}

func TestCapacityDuringTheResyncWait(t *testing.T) {
	bubble(t, func(t *testing.T) {
		h := newHarness(t, withDecode(smallPool(128)))
		h.m.HoldForResync(time.Minute)
		if c := h.m.Capacity()[0]; c.BlockedBy != BlockedResync {
			t.Fatalf("during the resync wait: blocked_by %q, want %q", c.BlockedBy, BlockedResync)
		}
		if _, _, err := h.m.Resync(nil, true); err != nil {
			t.Fatal(err)
		}
		if c := h.m.Capacity()[0]; c.BlockedBy != "none" {
			t.Fatalf("after the resync: blocked_by %q, want none", c.BlockedBy)
		}
	})
}

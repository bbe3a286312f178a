package kvmanager

import "github.com/decodeplane/decodeplane/prealloc"

// ShardCapacity is one decode DP shard's capacity as admission sees it: the
// figures a router picks a decode instance by (Capacity.WatchCapacity, the
// etcd publication, /metrics). Every figure is read from the shard's ledger
// (prealloc.Ledger.Stats, the same read as GetStatus's shards): nothing is
// computed twice.
type ShardCapacity struct {
	Shard    int
	PageSize int
	// TokensTotal and PagesTotal are the shard's full-attention pool.
	TokensTotal, PagesTotal int64
	// TokensFree is what the ledger would still admit now: the admission
	// budget (prealloc.Stats.Budget: free tokens less the decode
	// reservation of the admitted and running rooms and the needs of the
	// retracted ones; pages held by admitted or draining rooms are not
	// free), never below 0. PagesFree is TokensFree in whole pages.
	TokensFree, PagesFree int64
	// ReqSlotsTotal and ReqSlotsFree are the request (req_to_token) slots
	// (request_slots + pre_alloc_slots).
	ReqSlotsTotal, ReqSlotsFree int64
	// QueueDepth counts the rooms opened and not admitted yet: waiting for
	// their prefill's registration or DP rank, and queued for KV.
	QueueDepth int
	// BlockedBy is why the last admission pass stopped at the head of the
	// queue (prealloc.BlockReason's name, as GetStatus reports it), or
	// "resync" while admission waits for the decode engine's resync.
	BlockedBy string
	// DrainingPages are pages of ended rooms that wait for prefill
	// acknowledgements (AckRoomEnd): neither free nor reusable yet.
	DrainingPages int64
	// Running counts the rooms decoding on the shard.
	Running int
	// ReservedDecodeTokens is R (admission.reserved_decode_tokens): what a
	// fresh request needs beyond its pages.
	ReservedDecodeTokens int
}

// BlockedResync is ShardCapacity.BlockedBy while admission waits for the
// decode engine's resync (resync.go).
const BlockedResync = "resync"

// BlockedUnreported is ShardCapacity.BlockedBy of a shard whose decode
// engine owns the pages (kv_pool.owner: engine) and has not reported its
// capacity yet (ReportCapacity): its free figures are 0 until it does, so
// that no router sends requests to an engine whose room it cannot see.
const BlockedUnreported = "engine_unreported"

// Capacity returns every shard's capacity, index = decode DP rank. It reads
// each shard's ledger once under the ledger's own lock, one shard at a
// time, and takes no shard lock: a poller (the capacity stream polls at its
// min_interval) costs the room path nothing but a ledger lock's wait. When
// the decode engine owns the pages the free figures, the queue and the
// running rooms are its last report (ReportCapacity), the pool and the
// draining pages the hand-off ledger's (shardStats).
func (m *Manager) Capacity() []ShardCapacity {
	gated := m.rs.gated.Load()
	page := int64(m.layout.PageSize)
	out := make([]ShardCapacity, len(m.shards))
	for i, sh := range m.shards {
		out[i] = shardCapacity(sh.stats(), page, gated)
		out[i].ReservedDecodeTokens = m.dec.Admission.ReservedDecodeTokens
		if sh.holds != nil && sh.engineCap.Load() == nil && !gated {
			out[i].BlockedBy = BlockedUnreported
		}
	}
	return out
}

// shardCapacity derives a shard's capacity from its ledger stats.
func shardCapacity(st prealloc.Stats, page int64, gated bool) ShardCapacity {
	free := max(st.Budget, 0)
	c := ShardCapacity{
		Shard: st.Shard, PageSize: int(page),
		TokensTotal: st.Pages.Total * page, PagesTotal: st.Pages.Total,
		TokensFree: free, PagesFree: free / max(page, 1),
		ReqSlotsTotal: st.ReqSlots.Total, ReqSlotsFree: st.ReqSlots.Free,
		QueueDepth:    st.Waiting + st.Ready,
		BlockedBy:     st.LastBlocked.String(),
		DrainingPages: st.Pages.Draining,
		Running:       st.Running,
	}
	if gated {
		c.BlockedBy = BlockedResync
	}
	return c
}

// stats is the shard's ledger stats. When the decode engine owns the pages
// the allocator stays empty, so they are made from what is known: the
// pools' sizes (the allocator's totals), the hand-off ledger's holds
// (queued rooms, declared rooms, draining pages) and the engine's last
// capacity report (free figures and running rooms; 0 free before its first
// report). Budget is the engine's free tokens: it admits by its own rules.
func (sh *shard) stats() prealloc.Stats {
	st := sh.led.Stats()
	if sh.holds == nil {
		return st
	}
	hs := sh.holds.Stats()
	var rep EngineCapacity
	if c := sh.engineCap.Load(); c != nil {
		rep = *c
	}
	free := func(r *prealloc.ResourceStats, n int64) {
		r.Free = min(n, r.Total)
		r.Used = r.Total - r.Free
	}
	free(&st.Pages, rep.PagesFree)
	st.Pages.Draining = hs.DrainingPages
	free(&st.ReqSlots, rep.ReqSlotsFree)
	free(&st.MetaSlots, rep.MetaSlotsFree)
	if st.MambaSlots.Total > 0 {
		free(&st.MambaSlots, rep.StateSlots)
	}
	if st.SWAPages.Total > 0 {
		free(&st.SWAPages, rep.StateSlots)
	}
	st.Waiting, st.Ready = 0, max(hs.Queued, rep.QueueDepth)
	st.Admitted, st.Running, st.Draining = hs.Held-hs.Draining, rep.Running, hs.Draining
	st.Budget, st.FullBudget = rep.TokensFree, rep.TokensFree
	return st
}

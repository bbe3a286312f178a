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

// Capacity returns every shard's capacity, index = decode DP rank. It reads
// each shard's ledger once under the ledger's own lock, one shard at a
// time, and takes no shard lock: a poller (the capacity stream polls at its
// min_interval) costs the room path nothing but a ledger lock's wait.
func (m *Manager) Capacity() []ShardCapacity {
	gated := m.rs.gated.Load()
	page := int64(m.layout.PageSize)
	out := make([]ShardCapacity, len(m.shards))
	for i, sh := range m.shards {
		out[i] = shardCapacity(sh.led.Stats(), page, gated)
		out[i].ReservedDecodeTokens = m.dec.Admission.ReservedDecodeTokens
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

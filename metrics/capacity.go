package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The router-facing capacity figures (kvmanager.Manager.Capacity, the same
// as Capacity.WatchCapacity's shards) that the ledger gauges do not already
// export: the admission budget in tokens and the pool in tokens. Pages,
// request slots, queue depth, the head-of-line reason, draining pages and
// running rooms are decodeplane_kv_pages, decodeplane_request_slots,
// decodeplane_admission_queue_depth, decodeplane_admission_blocked,
// decodeplane_pages_draining and decodeplane_ledger_rooms. Read at scrape
// time, never updated on the room path.

var (
	descTokensFree = prometheus.NewDesc("decodeplane_shard_tokens_free",
		"Tokens a decode DP shard would still admit now: free tokens less the decode reservation of its admitted and running rooms and the needs of its retracted ones (WatchCapacity's tokens_free).", []string{"dp_rank"}, nil)
	descTokensTotal = prometheus.NewDesc("decodeplane_shard_tokens_total",
		"Tokens of a decode DP shard's full-attention pool (WatchCapacity's tokens_total).", []string{"dp_rank"}, nil)
)

// capacityCollector reports the capacity gauges from Manager.Capacity.
type capacityCollector struct{ m *Metrics }

func (c capacityCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descTokensFree
	ch <- descTokensTotal
}

func (c capacityCollector) Collect(ch chan<- prometheus.Metric) {
	mgr := c.m.attached()
	if mgr == nil {
		return
	}
	for _, sc := range mgr.Capacity() {
		s := strconv.Itoa(sc.Shard)
		ch <- prometheus.MustNewConstMetric(descTokensFree, prometheus.GaugeValue, float64(sc.TokensFree), s)
		ch <- prometheus.MustNewConstMetric(descTokensTotal, prometheus.GaugeValue, float64(sc.TokensTotal), s)
	}
}

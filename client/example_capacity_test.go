package client_test

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// capacityView is a router's view of its decode daemons: the latest
// CapacityUpdate of each, and when it arrived.
type capacityView struct {
	keepalive time.Duration
	mu        sync.Mutex
	daemons   map[string]heard
	changed   chan struct{} // closed and replaced at every update
}

type heard struct {
	latest *pb.CapacityUpdate
	at     time.Time
}

func newCapacityView(keepalive time.Duration) *capacityView {
	return &capacityView{keepalive: keepalive, daemons: map[string]heard{}, changed: make(chan struct{})}
}

// follow keeps the latest update of one daemon until its stream ends (a
// real router opens it again, with a back-off).
func (v *capacityView) follow(ctx context.Context, name string, c *client.Client) error {
	s, err := c.Admin().WatchCapacity(ctx, client.CapacityOptions{MinInterval: 10 * time.Millisecond, Keepalive: v.keepalive})
	if err != nil {
		return err
	}
	defer s.Close()
	for {
		u, err := s.Next()
		if err != nil {
			return err
		}
		v.mu.Lock()
		v.daemons[name] = heard{latest: u, at: time.Now()}
		close(v.changed)
		v.changed = make(chan struct{})
		v.mu.Unlock()
	}
}

// await waits until cond holds on the view.
func (v *capacityView) await(ctx context.Context, cond func(map[string]heard) bool) error {
	for {
		v.mu.Lock()
		ok, changed := cond(v.daemons), v.changed
		v.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// choice is where a request goes: a daemon (and the process it was picked
// from) and its decode DP shard.
type choice struct {
	daemon      string
	incarnation uint64
	shard       uint32
}

// pick chooses, among the daemons that are ready, not draining and heard
// from within twice the keepalive, the shard with the most tokens_free
// that fits a fresh request of prompt tokens (its pages and the shard's
// reserved decode tokens); ties go to the shorter queue.
func (v *capacityView) pick(prompt uint64, now time.Time) (choice, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	var best *pb.ShardCapacity
	var out choice
	for _, name := range slices.Sorted(maps.Keys(v.daemons)) {
		h := v.daemons[name]
		u := h.latest
		if !u.GetReady() || u.GetDraining() || now.Sub(h.at) > 2*v.keepalive {
			continue
		}
		for _, s := range u.GetShards() {
			page := max(uint64(s.GetPageSize()), 1)
			need := (prompt+page-1)/page*page + uint64(s.GetReservedDecodeTokens())
			if need > s.GetTokensFree() {
				continue
			}
			if best == nil || s.GetTokensFree() > best.GetTokensFree() ||
				s.GetTokensFree() == best.GetTokensFree() && s.GetQueueDepth() < best.GetQueueDepth() {
				best, out = s, choice{daemon: name, incarnation: u.GetIncarnation(), shard: s.GetDpRank()}
			}
		}
	}
	return out, best != nil
}

// valid tells whether the daemon a request went to is still the process it
// was picked from: another incarnation means it restarted mid-request and
// the request's room is gone (route the request again).
func (v *capacityView) valid(ch choice) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.daemons[ch.daemon].latest.GetIncarnation() == ch.incarnation
}

// A router picks a decode instance from the daemons' capacity streams:
// decode-a has two DP shards of 32768 tokens, one of them busy with an
// 8000-token request; decode-b has one shard of 65536 tokens, then drains.
func ExampleAdmin_WatchCapacity() {
	pool := func(dp int, tokens int64) daemonConfig {
		return daemonConfig{decode: func(c *kvlayout.Config) { c.Parallel.DP, c.Pool.TotalTokens = dp, tokens }}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	clients := map[string]*client.Client{}
	for name, dc := range map[string]daemonConfig{"decode-a": pool(2, 32768), "decode-b": pool(1, 65536)} {
		d, err := startDaemon(dc)
		if err != nil {
			log.Fatal(err)
		}
		defer d.stop()
		c, err := client.New("passthrough:///bufnet", client.WithDialOptions(d.dialer()))
		if err != nil {
			log.Fatal(err)
		}
		defer c.Close()
		clients[name] = c
	}
	// decode-a's shard 0 runs a request of 8000 prompt tokens.
	a := clients["decode-a"]
	if _, err := a.Prefill(prefillRank("10.0.0.1:8998", 1, 0)).Register(ctx); err != nil {
		log.Fatal(err)
	}
	shard0 := uint32(0)
	if _, err := a.Engine().OpenRoom(ctx, &pb.OpenRoomRequest{Rid: "busy", BootstrapAddr: "10.0.0.1:8998", Room: 1, PromptLen: 8000, MaxNewTokens: 128, DecodeDpRank: &shard0}); err != nil {
		log.Fatal(err)
	}

	// The router follows every daemon's stream.
	view := newCapacityView(time.Second)
	watchCtx, stopWatching := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for name, c := range clients {
		wg.Go(func() { _ = view.follow(watchCtx, name, c) })
	}
	defer func() { stopWatching(); wg.Wait() }()
	if err := view.await(ctx, func(m map[string]heard) bool { return len(m) == 2 }); err != nil {
		log.Fatal(err)
	}
	view.mu.Lock()
	for _, name := range slices.Sorted(maps.Keys(view.daemons)) {
		for _, s := range view.daemons[name].latest.GetShards() {
			fmt.Printf("%s shard %d: %d of %d tokens free, queue %d\n", name, s.GetDpRank(), s.GetTokensFree(), s.GetTokensTotal(), s.GetQueueDepth())
		}
	}
	view.mu.Unlock()

	route := func(prompt uint64) {
		if ch, ok := view.pick(prompt, time.Now()); ok {
			fmt.Printf("%d-token request -> %s shard %d\n", prompt, ch.daemon, ch.shard)
		} else {
			fmt.Printf("%d-token request -> no decode instance fits now\n", prompt)
		}
	}
	route(1000)

	if _, err := clients["decode-b"].Admin().Drain(ctx); err != nil {
		log.Fatal(err)
	}
	if err := view.await(ctx, func(m map[string]heard) bool { return m["decode-b"].latest.GetDraining() }); err != nil {
		log.Fatal(err)
	}
	fmt.Println("decode-b drains")
	route(1000)
	route(40000)

	ch, _ := view.pick(1000, time.Now())
	fmt.Println("still the same", ch.daemon, "process:", view.valid(ch))
	// Output:
	// decode-a shard 0: 24256 of 32768 tokens free, queue 0
	// decode-a shard 1: 32768 of 32768 tokens free, queue 0
	// decode-b shard 0: 65536 of 65536 tokens free, queue 0
	// 1000-token request -> decode-b shard 0
	// decode-b drains
	// 1000-token request -> decode-a shard 1
	// 40000-token request -> no decode instance fits now
	// still the same decode-a process: true
}

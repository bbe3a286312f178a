package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// --fleet: the rooms are spread over the daemons of --target's fleet, one
// decode engine per daemon (room % daemons), and each prefill rank is a
// client.FleetPrefill registered through --target only: it is told only
// the room, and hands it off on the daemon that offered it. The run counts
// the rooms of each daemon and checks that every room was handed off on
// the daemon it was opened on.

// benchSender hands a room off for one prefill rank: its Prefill on the
// daemon, or with --fleet its FleetPrefill.
type benchSender interface {
	SendRoom(ctx context.Context, room uint64, o client.SendOptions) (*pb.Destination, error)
}

// benchEngine is one decode daemon's engine and the rooms it succeeded.
type benchEngine struct {
	addr   string
	e      *client.Engine
	rooms  atomic.Int64
	routed atomic.Int64 // handed off on this daemon by every FleetPrefill
}

// engineOf is the decode engine room is opened on.
func (b *benchRun) engineOf(room uint64) *benchEngine {
	return b.engines[room%uint64(len(b.engines))]
}

// routed counts a room that succeeded on its daemon, and whether every
// FleetPrefill of the room handed it off there.
func (b *benchRun) routed(room uint64, senders []benchSender) {
	e := b.engineOf(room)
	e.rooms.Add(1)
	if !b.o.fleet {
		return
	}
	for _, s := range senders {
		fp, ok := s.(*client.FleetPrefill)
		if !ok {
			return
		}
		if owner, ok := fp.Owner(room); !ok || owner != e.addr {
			return
		}
	}
	e.routed.Add(1)
}

// joinFleet connects a decode engine to each daemon of --target's fleet
// (--target first, at most --fleet-daemons of them) and runs one
// FleetPrefill per prefill rank, registered through --target, until hbCtx
// ends; it returns once every rank is registered and holds a session with
// each daemon the rooms go to.
func (b *benchRun) joinFleet(ctx, hbCtx context.Context, token string, admin *client.Admin) error {
	o := b.o
	resp, err := admin.GetFleet(ctx)
	if err != nil {
		return fmt.Errorf("--fleet: GetFleet from %s: %w", b.tgt.addr, err)
	}
	var addrs []string
	for _, d := range resp.GetDaemons() {
		if d.GetSelf() {
			addrs = append([]string{d.GetAddress()}, addrs...)
		} else if d.GetAddress() != "" {
			addrs = append(addrs, d.GetAddress())
		}
	}
	if o.fleetDaemons > 0 {
		if o.fleetDaemons > len(addrs) {
			return fmt.Errorf("--fleet-daemons %d: the fleet of %s has %d daemons (%v)", o.fleetDaemons, b.tgt.addr, len(addrs), addrs)
		}
		addrs = addrs[:o.fleetDaemons]
	}
	b.engines = b.engines[:0]
	for i, addr := range addrs {
		e := b.engine
		if i > 0 {
			c, err := b.connectTo(addr, token, nil)
			if err != nil {
				return err
			}
			e = c.Engine()
		}
		b.engines = append(b.engines, &benchEngine{addr: addr, e: e})
	}
	return b.runFleetRanks(ctx, hbCtx, token, addrs)
}

// runFleetRanks starts the FleetPrefills (--dp x --prefill-ranks) and
// waits until each registered and holds a session with each of addrs.
func (b *benchRun) runFleetRanks(ctx, hbCtx context.Context, token string, addrs []string) error {
	o, layout := b.o, b.status.GetLayout()
	tag := rand.Uint32()
	b.addr = fmt.Sprintf("bench-%08x:8998", tag)
	instance := fmt.Sprintf("decodeplane-bench-%d-%08x", os.Getpid(), tag)
	b.base = 1 + rand.Uint64N(1<<40)<<20
	b.groups = make([][]benchSender, o.dp)
	errs := make(chan error, o.dp*o.prefillRanks)
	for dp := range o.dp {
		for tp := range o.prefillRanks {
			reg := &pb.RegisterPrefillRequest{
				BootstrapAddr: b.addr,
				RankEndpoint:  fmt.Sprintf("127.0.0.1:%d", 17000+dp*o.prefillRanks+tp),
				Parallel: &pb.ParallelInfo{AttnTpSize: uint32(o.prefillRanks), AttnTpRank: uint32(tp),
					AttnDpSize: uint32(o.dp), AttnDpRank: uint32(dp), PpSize: 1},
				PageSize: layout.GetPageSize(), KvCacheDtype: layout.GetKvCacheDtype(),
				LoadBalanceMethod: "follow_bootstrap_room", InstanceId: instance,
			}
			fp, err := client.NewFleetPrefill(b.tgt.addr, reg, client.FleetClientOptions(b.clientOptions(token, b.onDest)...),
				client.FleetPrefillOptions(client.OnHeartbeatError(func(error) { b.hbErrors.Add(1) })))
			if err != nil {
				return err
			}
			b.fleetRanks = append(b.fleetRanks, fp)
			b.hbWG.Go(func() {
				if err := fp.Run(hbCtx); err != nil && hbCtx.Err() == nil {
					errs <- fmt.Errorf("prefill rank dp %d tp %d: %w", dp, tp, err)
				}
			})
			b.groups[dp] = append(b.groups[dp], fp)
			b.ranks++
		}
	}
	for _, fp := range b.fleetRanks {
		if err := b.awaitSessions(ctx, fp, addrs, errs); err != nil {
			return err
		}
	}
	return nil
}

// awaitSessions waits until fp registered and holds a session with each of
// addrs (a FleetPrefill finds the daemons every FleetRefresh).
func (b *benchRun) awaitSessions(ctx context.Context, fp *client.FleetPrefill, addrs []string, errs <-chan error) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if reg := fp.Seed().Registration(); reg != nil {
			if reg.GetMapping().GetStagingRequired() {
				return fmt.Errorf("the daemon needs the staging path for prefill TP %d -> decode TP %d (staging.enabled): the bench's fleet sends direct transfers only; turn staging off", b.o.prefillRanks, b.decTP)
			}
			up := map[string]bool{}
			for _, d := range fp.Daemons() {
				up[d.Address] = d.Session
			}
			if !slices.ContainsFunc(addrs, func(a string) bool { return !up[a] }) {
				return nil
			}
		}
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("--fleet: the prefill ranks did not register through %s and open a session with each of %v in time (%v): %w",
				b.tgt.addr, addrs, fp.Daemons(), ctx.Err())
		case <-t.C:
		}
	}
}

// describeFleet is the setup line of --fleet.
func (b *benchRun) describeFleet() string {
	var addrs []string
	for _, e := range b.engines {
		addrs = append(addrs, e.addr)
	}
	return fmt.Sprintf("routing     rooms spread over %d daemon(s) %v; each prefill rank a FleetPrefill registered through %s, told only the room",
		len(addrs), addrs, b.tgt.addr)
}

// benchDaemonRooms is what one daemon of the run did.
type benchDaemonRooms struct {
	Addr   string `json:"address"`
	Rooms  int64  `json:"rooms_succeeded"`
	Routed int64  `json:"rooms_routed"`
}

// roomsByDaemon is each daemon's rooms (with --fleet).
func (b *benchRun) roomsByDaemon() []benchDaemonRooms {
	if !b.o.fleet {
		return nil
	}
	out := make([]benchDaemonRooms, 0, len(b.engines))
	for _, e := range b.engines {
		out = append(out, benchDaemonRooms{Addr: e.addr, Rooms: e.rooms.Load(), Routed: e.routed.Load()})
	}
	return out
}

package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// prefillSpec describes a simulated prefill instance.
type prefillSpec struct {
	addr     string // bootstrap address (host:port; nothing listens there)
	instance string // instance_id
	tp, dp   int    // attention TP ranks per DP group, DP groups (0: 1)
	lb       string // load_balance_method ("" = follow_bootstrap_room)
	host     string // rank endpoints' host ("" = the bootstrap host)
	pageSize int    // 0: the daemons' default 64
}

// Prefill is a simulated prefill instance: one Go client (its own
// connection) and one client.Prefill per rank, each registered and
// heartbeating (RunHeartbeat, on its PrefillSession) until silenced or
// closed, and sending rooms with SendRoom.
type Prefill struct {
	s     *Stage
	spec  prefillSpec
	d     *Daemon
	c     *client.Client
	ranks []*client.Prefill
	regs  []*pb.RegisterPrefillRequest // each rank's registration
	// chunkPages cuts each rank's hand-off into chunks; source, when set,
	// locates each chunk's bytes at the transfer agent.
	chunkPages int
	source     func(rank int, ch client.Chunk) *pb.TransferSource

	mu    sync.Mutex
	beats []context.CancelFunc
	done  []chan error
}

// newPrefill registers every rank of spec with d and starts its heartbeat.
func (s *Stage) newPrefill(ctx context.Context, d *Daemon, spec prefillSpec) (*Prefill, error) {
	if spec.tp == 0 {
		spec.tp = 1
	}
	if spec.dp == 0 {
		spec.dp = 1
	}
	if spec.pageSize == 0 {
		spec.pageSize = 64
	}
	if spec.host == "" {
		spec.host, _, _ = strings.Cut(spec.addr, ":")
	}
	c, err := client.New(d.Addr)
	if err != nil {
		return nil, err
	}
	p := &Prefill{s: s, spec: spec, d: d, c: c, chunkPages: 2}
	for dp := range spec.dp {
		for tp := range spec.tp {
			reg := &pb.RegisterPrefillRequest{
				BootstrapAddr: spec.addr, RankEndpoint: fmt.Sprintf("%s:%d", spec.host, 17000+100*dp+tp),
				Parallel: &pb.ParallelInfo{AttnTpSize: uint32(spec.tp), AttnTpRank: uint32(tp), AttnDpSize: uint32(spec.dp), AttnDpRank: uint32(dp), PpSize: 1},
				PageSize: uint32(spec.pageSize), KvCacheDtype: "bf16", InstanceId: spec.instance, LoadBalanceMethod: spec.lb}
			p.regs = append(p.regs, reg)
			p.ranks = append(p.ranks, c.Prefill(reg))
		}
	}
	for i, r := range p.ranks {
		if _, err := r.Register(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("register %s rank %d: %w", spec.addr, i, err)
		}
	}
	for i := range p.ranks {
		p.beat(i)
	}
	s.mu.Lock()
	s.prefills = append(s.prefills, p)
	s.mu.Unlock()
	return p, nil
}

// beat starts rank i's heartbeat.
func (p *Prefill) beat(i int) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.ranks[i].RunHeartbeat(ctx) }()
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.beats) <= i {
		p.beats, p.done = append(p.beats, nil), append(p.done, nil)
	}
	p.beats[i], p.done[i] = cancel, done
}

// Silence stops rank i's heartbeat (it sends nothing more).
func (p *Prefill) Silence(i int) {
	p.mu.Lock()
	cancel, done := p.beats[i], p.done[i]
	p.beats[i], p.done[i] = nil, nil
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

// Revive registers rank i again and restarts its heartbeat.
func (p *Prefill) Revive(ctx context.Context, i int) error {
	if _, err := p.ranks[i].Register(ctx); err != nil {
		return fmt.Errorf("register %s rank %d again: %w", p.spec.addr, i, err)
	}
	p.beat(i)
	return nil
}

// Close stops every heartbeat and closes the client (its sessions end:
// the process is gone).
func (p *Prefill) Close() {
	for i := range p.ranks {
		p.mu.Lock()
		has := i < len(p.beats) && p.beats[i] != nil
		p.mu.Unlock()
		if has {
			p.Silence(i)
		}
	}
	p.c.Close()
}

// Send hands room off from every rank at once (SendRoom: claim, chunks,
// then wait for the room's success) and returns the first error.
func (p *Prefill) Send(ctx context.Context, room uint64) error {
	errs := make([]error, len(p.ranks))
	var wg sync.WaitGroup
	for i, r := range p.ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := client.SendOptions{ChunkPages: p.chunkPages, OutputIDs: []int32{7}}
			if p.source != nil {
				o.Source = func(ch client.Chunk) *pb.TransferSource { return p.source(i, ch) }
			}
			if _, err := r.SendRoom(ctx, room, o); err != nil {
				errs[i] = fmt.Errorf("rank %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Deliver sends every room, conc at a time, and returns each room's error
// (nil when it succeeded).
func (p *Prefill) Deliver(ctx context.Context, rooms []uint64, conc int) map[uint64]error {
	out := make(map[uint64]error, len(rooms))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(conc, 1))
	for _, room := range rooms {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := p.Send(ctx, room)
			mu.Lock()
			out[room] = err
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// failedSends counts the rooms whose hand-off failed, and names up to
// three with their errors.
func failedSends(res map[uint64]error) (int, string) {
	n := 0
	var some []string
	for room, err := range res {
		if err == nil {
			continue
		}
		n++
		if len(some) < 3 {
			some = append(some, fmt.Sprintf("room %d: %v", room, err))
		}
	}
	return n, strings.Join(some, "; ")
}

package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/decodeplane/decodeplane/client"
	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The KV geometry of the scenarios that move bytes through the reference
// agent: small, so that every page the daemon and the prefill register
// fits in the agent's host memory.
const (
	agentLayers   = 2
	agentHeads    = 2
	agentHeadDim  = 16
	agentPageSize = 16
	agentPrompt   = 256 // tokens: 16 pages
	prefillPages  = 64  // pages of each prefill rank's buffer
)

// agentSets are the daemon settings of the delegated path to agent at
// addr: its geometry, and each batch bounded by batchTimeout.
func agentSets(addr string, batchTimeout string) []string {
	return []string{"transfer.path=delegate", "transfer.delegate.target=" + addr, "transfer.delegate.batch_timeout=" + batchTimeout,
		"transfer.delegate.health_interval=200ms", "kv_pool.kind=gqa", fmt.Sprintf("kv_pool.num_layers=%d", agentLayers),
		fmt.Sprintf("kv_pool.kv_heads=%d", agentHeads), fmt.Sprintf("kv_pool.head_dim=%d", agentHeadDim), "kv_pool.dtype=bf16",
		fmt.Sprintf("kv_pool.page_size=%d", agentPageSize), "kv_pool.total_pages=4096"}
}

// agentPageBytes is one page of a prefill rank's buffer at prefill TP tp:
// every layer, K and V.
func agentPageBytes(tp int) int {
	return agentLayers * 2 * agentPageSize * max(1, agentHeads/tp) * agentHeadDim * 2
}

// Agent is the reference transfer agent's process.
type Agent struct {
	s    *Stage
	Addr string
	p    *proc
	conn *grpc.ClientConn
	x    transferv1.TransferAgentClient
}

// startAgent starts decodeplane-agent on a free port with extra flags and
// waits until it serves.
func (s *Stage) startAgent(ctx context.Context, extra ...string) (*Agent, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	a := &Agent{s: s, Addr: addr}
	if err := a.run(ctx, extra); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	a.conn, a.x = conn, transferv1.NewTransferAgentClient(conn)
	s.mu.Lock()
	s.closers = append(s.closers, func() { conn.Close() })
	s.mu.Unlock()
	return a, nil
}

func (a *Agent) run(ctx context.Context, extra []string) error {
	// An agent holding batches logs each at debug level: the scenario waits
	// on the line of each room (the lines at DEBUG are not counted).
	level := "info"
	if slices.Contains(extra, holdRoomsFlag) {
		level = "debug"
	}
	p, err := a.s.start("decodeplane-agent", a.s.o.Bins.Agent, append([]string{"--listen", a.Addr, "--log-level", level}, extra...)...)
	if err != nil {
		return err
	}
	a.p = p
	a.s.mu.Lock()
	a.s.logged = append(a.s.logged, p)
	a.s.mu.Unlock()
	return waitServing(ctx, a.Addr, p)
}

// Kill kills the agent (SIGKILL); Restart starts it again on its port.
func (a *Agent) Kill() error { return a.p.signal(syscall.SIGKILL) }

func (a *Agent) Restart(ctx context.Context, extra ...string) error { return a.run(ctx, extra) }

const holdRoomsFlag = "--fault-hold-rooms"

// holdFlag is the agent's flag that accepts the batches of rooms and
// never runs them (until cancelled or past their deadline).
func holdFlag(rooms []uint64) []string {
	ids := make([]string, len(rooms))
	for i, r := range rooms {
		ids[i] = fmt.Sprint(r)
	}
	return []string{holdRoomsFlag, strings.Join(ids, ",")}
}

// useAgent registers each rank's KV buffer with the agent and makes the
// prefill's chunks name their bytes there.
func (p *Prefill) useAgent(ctx context.Context, a *Agent) error {
	req := &transferv1.RegisterBuffersRequest{}
	for i := range p.ranks {
		req.Buffers = append(req.Buffers, &transferv1.Buffer{Name: p.bufferName(i), Kind: transferv1.BufferKind_BUFFER_KIND_PREFILL_KV,
			Length: uint64(prefillPages * agentPageBytes(p.spec.tp)), ItemSize: uint64(agentPageBytes(p.spec.tp))})
	}
	if _, err := a.x.RegisterBuffers(ctx, req); err != nil {
		return fmt.Errorf("RegisterBuffers at the agent: %w", err)
	}
	p.chunkPages = 4
	p.source = func(rank int, ch client.Chunk) *pb.TransferSource {
		src := &pb.TransferSource{Buffer: p.bufferName(rank)}
		for i := range ch.NumPages {
			src.PageIndices = append(src.PageIndices, int32((ch.PageOffset+i)%prefillPages))
		}
		return src
	}
	return nil
}

func (p *Prefill) bufferName(rank int) string {
	return fmt.Sprintf("prefill/%s/tp%d/kv", p.spec.addr, rank)
}

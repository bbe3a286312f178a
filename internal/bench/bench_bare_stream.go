package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	benchv1 "github.com/decodeplane/decodeplane/proto/decodeplane/bench/v1"
)

// The bare bound of the stream mix (--api stream): the rooms the machine
// sustains when each carries, on long-lived bidirectional streams and with
// no decodeplane logic behind them, the messages a room of this run
// carried on its sessions. The mix is derived from the run, not from a
// table: per room, the messages sent and received on the EngineSession and
// on the PrefillSessions (benchCounts, messages of every kind: opens,
// batches, events, pings) and their mean sizes (proto.Size of each, both
// ways). The sessions' own opens are left out (a few per run, not per room).
//
// The bare fleet has the run's shape: the bare server's Bench/Session
// stands for both sessions; one stream on the decode engine's connection,
// one on each sending prefill rank's, each multiplexing every room in
// flight (--concurrency workers, one room at a time each). A room of DP
// group g (room index % DP, as follow_bootstrap_room) sends on the engine
// stream and on each of its group's prefill streams that stream's share of
// the mix; each message asks the server for part of the room's replies
// (of the received mean size), and the room is done once its replies are
// in. Fractional means are spread over each worker's rooms (room k sends
// floor((k+1)m) - floor(km) messages); replies due on a stream a room sends
// nothing on go with that worker's next message on it. A client goroutine
// per stream hands each reply to its worker by tag; sends share the stream
// under a mutex. Sizes are matched by padding: a message is within a few
// bytes of its mean (its small varint fields vary).

// benchBareMaxPad bounds a bare message's padding.
const benchBareMaxPad = 1 << 16

// Session answers each message with m.Replies messages of m.ReplyBytes
// padding, carrying its tag, until the client ends the stream.
func (benchBareService) Session(s grpc.BidiStreamingServer[benchv1.SessionMessage, benchv1.SessionMessage]) error {
	var pad []byte
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		n := int(min(m.GetReplyBytes(), benchBareMaxPad))
		if len(pad) < n {
			pad = make([]byte, n)
		}
		for range m.GetReplies() {
			// A message per send, as a real server's: gRPC may still use
			// one after Send returns.
			if err := s.Send(&benchv1.SessionMessage{Tag: m.GetTag(), Payload: pad[:n]}); err != nil {
				return err
			}
		}
	}
}

// benchBareSessionMix is one session's share of a room: per stream, the
// messages sent and received and their mean sizes in bytes.
type benchBareSessionMix struct {
	// Streams is how many such sessions a room uses: 1 engine session,
	// its DP group's sending prefill ranks' (mean over the groups).
	Streams       float64 `json:"streams_per_room"`
	Sent          float64 `json:"sent_per_stream"`
	Received      float64 `json:"received_per_stream"`
	SentBytes     float64 `json:"sent_mean_bytes"`
	ReceivedBytes float64 `json:"received_mean_bytes"`
}

// benchBareMix is the stream mix the bare phase reproduces.
type benchBareMix struct {
	Source  string              `json:"source"`
	Engine  benchBareSessionMix `json:"engine_session"`
	Prefill benchBareSessionMix `json:"prefill_session"`
}

// total is what the mix sends and receives per room, all streams.
func (m *benchBareMix) total() (sent, received float64) {
	return m.Engine.Streams*m.Engine.Sent + m.Prefill.Streams*m.Prefill.Sent,
		m.Engine.Streams*m.Engine.Received + m.Prefill.Streams*m.Prefill.Received
}

// benchStreamMixOf derives the stream mix from the measured rooms: nil and
// why when there is none to model.
func benchStreamMixOf(lc *benchPhase, groups [][]benchSender) (*benchBareMix, string) {
	rooms := lc.ok + lc.failed
	if rooms == 0 {
		return nil, "no room finished: no stream mix to reproduce"
	}
	senders := 0.0
	for _, g := range groups {
		senders += float64(len(g))
	}
	senders /= float64(len(groups))
	one := func(m int, streams float64) benchBareSessionMix {
		c := lc.counts
		r := benchBareSessionMix{Streams: streams,
			Sent:     float64(c.Sent[m]) / float64(rooms) / streams,
			Received: float64(c.Msgs[m]) / float64(rooms) / streams}
		if c.Sent[m] > 0 {
			r.SentBytes = float64(c.SentBytes[m]) / float64(c.Sent[m])
		}
		if c.Msgs[m] > 0 {
			r.ReceivedBytes = float64(c.RecvBytes[m]) / float64(c.Msgs[m])
		}
		return r
	}
	mix := &benchBareMix{
		Source: "this run's measured rooms: session messages per room, both ways, and their mean proto sizes",
		Engine: one(benchEngineSessionMethod, 1), Prefill: one(benchPrefillSessionMethod, senders),
	}
	for _, s := range []struct {
		name string
		m    benchBareSessionMix
	}{{"EngineSession", mix.Engine}, {"PrefillSession", mix.Prefill}} {
		if s.m.Sent == 0 && s.m.Received > 0 {
			return nil, fmt.Sprintf("the rooms received on %s but sent nothing on it: the bare session answers messages, it cannot reproduce that mix", s.name)
		}
	}
	if sent, recv := mix.total(); sent == 0 || recv == 0 {
		return nil, "the rooms sent or received no session message: no stream mix to reproduce"
	}
	return mix, ""
}

// benchBareStreamPlan is a session type's share of a bare room.
type benchBareStreamPlan struct {
	sent, received float64 // per room
	pad, replyPad  int     // padding of a sent message, of a reply
}

func newBenchBareStreamPlan(m benchBareSessionMix) benchBareStreamPlan {
	// A request: tag, replies, reply_bytes (small varints), payload.
	// A reply: tag, payload.
	req := &benchv1.SessionMessage{Tag: 1, Replies: 1, ReplyBytes: 1}
	rep := &benchv1.SessionMessage{Tag: 1}
	return benchBareStreamPlan{sent: m.Sent, received: m.Received,
		pad: benchPad(m.SentBytes, proto.Size(req)), replyPad: benchPad(m.ReceivedBytes, proto.Size(rep))}
}

// benchPad is the payload length that brings a message of base bytes
// (without payload) to the target size, or as near under it as can be.
func benchPad(target float64, base int) int {
	t := int(math.Round(target))
	for l := min(benchBareMaxPad, max(0, t-base-2)); l > 0; l-- {
		if base+1+protowire.SizeVarint(uint64(l))+l <= t {
			return l
		}
	}
	return 0
}

// benchSpread is how many of a mean of m per room room k gets: over rooms
// 0..k-1 they add up to floor(k*m).
func benchSpread(k int64, m float64) int64 {
	return int64(math.Floor(float64(k+1)*m)) - int64(math.Floor(float64(k)*m))
}

// benchBareSessionStream is one bare session stream, shared by the workers.
type benchBareSessionStream struct {
	mu sync.Mutex // Send
	s  grpc.BidiStreamingClient[benchv1.SessionMessage, benchv1.SessionMessage]
}

// benchBareWorker counts the replies its rooms received.
type benchBareWorker struct {
	got atomic.Int64
	sig chan struct{} // cap 1
}

// bareStreamMix measures the stream mix's bound: one op is one bare room.
func (b *benchRun) bareStreamMix(ctx context.Context, prog *benchProgress, e *benchBareEnv, mix *benchBareMix, res *benchBare, suffix string) error {
	res.Mix = mix
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m, err := b.openMix(sctx, e, mix)
	if err != nil {
		return err
	}
	var demux sync.WaitGroup
	defer demux.Wait()
	defer cancel()
	for _, st := range m.streams {
		demux.Go(func() { m.demux(st) })
	}
	prog.setPhase("bare stream mix"+suffix, 0)
	r, counts, err := benchMeasure(ctx, &e.counters, b.o.concurrency, b.o.bareDuration, m.work)
	if err != nil {
		return fmt.Errorf("stream mix: %w", err)
	}
	sentTotal, recvTotal := mix.total()
	r.Name = fmt.Sprintf("stream mix room (%.2f sent + %.2f received)", sentTotal, recvTotal)
	if r.Ops > 0 {
		r.SentPerOp = float64(counts.Sent[benchBareSession]) / float64(r.Ops)
		r.ReceivedPerOp = float64(counts.Msgs[benchBareSession]) / float64(r.Ops)
	}
	res.StreamMix = r
	for _, st := range m.streams {
		st.mu.Lock()
		_ = st.s.CloseSend()
		st.mu.Unlock()
	}
	return nil
}

// benchStreamMixRun is one stream-mix measurement: its streams (0 on the engine's
// connection, then the prefill ranks' on connections 1, 2, ... in group
// order), the workers' reply counts, and what a room sends on each side.
type benchStreamMixRun struct {
	streams         []*benchBareSessionStream
	groups          [][]int // per DP group, its ranks' streams
	workers         []*benchBareWorker
	engine, prefill benchBareStreamPlan
	pad             []byte
	next            atomic.Uint64 // the next room's group
}

// openMix opens the mix's streams, under ctx.
func (b *benchRun) openMix(ctx context.Context, e *benchBareEnv, mix *benchBareMix) (*benchStreamMixRun, error) {
	m := &benchStreamMixRun{engine: newBenchBareStreamPlan(mix.Engine), prefill: newBenchBareStreamPlan(mix.Prefill)}
	open := func(conn int) (int, error) {
		s, err := e.clients[conn].Session(ctx)
		if err != nil {
			return 0, err
		}
		m.streams = append(m.streams, &benchBareSessionStream{s: s})
		return len(m.streams) - 1, nil
	}
	if _, err := open(0); err != nil {
		return nil, fmt.Errorf("stream mix: open the engine stream: %w", err)
	}
	conn := 1
	for _, g := range b.groups {
		var idx []int
		for range g {
			i, err := open(conn)
			if err != nil {
				return nil, fmt.Errorf("stream mix: open a prefill stream: %w", err)
			}
			idx = append(idx, i)
			conn++
		}
		m.groups = append(m.groups, idx)
	}
	m.workers = make([]*benchBareWorker, b.o.concurrency)
	for i := range m.workers {
		m.workers[i] = &benchBareWorker{sig: make(chan struct{}, 1)}
	}
	if n := max(m.engine.pad, m.prefill.pad); n > 0 {
		m.pad = make([]byte, n)
	}
	return m, nil
}

// demux counts each reply of st for the worker it tags, until st ends.
func (m *benchStreamMixRun) demux(st *benchBareSessionStream) {
	for {
		msg, err := st.s.Recv()
		if err != nil {
			return
		}
		t := int(msg.GetTag()) - 1
		if t < 0 || t >= len(m.workers) {
			continue
		}
		w := m.workers[t]
		w.got.Add(1)
		select {
		case w.sig <- struct{}{}:
		default:
		}
	}
}

// work is worker wi: bare rooms one after the other (each its group's
// messages on the engine's and the ranks' streams, then the wait for every
// reply), counted in n, until ctx ends.
func (m *benchStreamMixRun) work(ctx context.Context, wi int, n *atomic.Int64) error {
	w := m.workers[wi]
	s := &benchStreamMixSender{m: m, tag: uint32(wi + 1), pending: make([]int64, len(m.streams))}
	for k := int64(0); ; k++ {
		g := m.groups[m.next.Add(1)%uint64(len(m.groups))]
		if err := s.send(0, &m.engine, k); err != nil {
			return err
		}
		for _, si := range g {
			if err := s.send(si, &m.prefill, k); err != nil {
				return err
			}
		}
		for w.got.Load() < s.want {
			select {
			case <-w.sig:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		n.Add(1)
	}
}

// benchStreamMixSender is a worker's sending side: the replies it asked for on
// each stream and not sent yet (a room's fractional share carried over),
// and every reply it waits for.
type benchStreamMixSender struct {
	m       *benchStreamMixRun
	tag     uint32
	pending []int64
	want    int64
}

// send sends room k's messages of plan on stream si, spreading the replies
// they ask for over them.
func (s *benchStreamMixSender) send(si int, plan *benchBareStreamPlan, k int64) error {
	ns := benchSpread(k, plan.sent)
	s.pending[si] += benchSpread(k, plan.received)
	if ns == 0 {
		return nil
	}
	st := s.m.streams[si]
	for j := range ns {
		r := s.pending[si] / ns
		if j < s.pending[si]%ns {
			r++
		}
		msg := &benchv1.SessionMessage{Tag: s.tag, Replies: uint32(r), ReplyBytes: uint32(plan.replyPad), Payload: s.m.pad[:plan.pad]}
		st.mu.Lock()
		err := st.s.Send(msg)
		st.mu.Unlock()
		if err != nil {
			return err
		}
	}
	s.want += s.pending[si]
	s.pending[si] = 0
	return nil
}

package faults

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// smallWindows dials addr with 64 KiB flow-control windows (which turns
// gRPC's window growth off), so that a client that stops reading is seen
// as such after 64 KiB instead of megabytes.
func (s *Stage) smallWindows(addr string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.closers = append(s.closers, func() { conn.Close() })
	s.mu.Unlock()
	return conn, nil
}

// slowEngine: the engine opens its rooms and aborts a tenth, then stops
// reading while the prefill delivers the rest; the daemon cuts its stream;
// it reconnects and watches every room from the last event it saw.
func slowEngine(ctx context.Context, s *Stage) error {
	n := s.rooms()
	// The pool holds every room: they stay until the engine, not reading,
	// learns they succeeded and releases them.
	d, err := s.startDaemon(ctx, "decodeplane", baseSets("admission.reserved_decode_tokens=0", poolFor(n), fmt.Sprintf("kv_pool.request_slots=%d", n))...)
	if err != nil {
		return err
	}
	p, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.40.0.1:8998", instance: "prefill"})
	if err != nil {
		return err
	}
	conn, err := s.smallWindows(d.Addr)
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, true, conn)
	if err != nil {
		return err
	}
	ids := roomIDs(1_000_000, n)
	if err := openPaced(ctx, eng, opens(p.spec.addr, ids)); err != nil {
		return err
	}
	aborted := every(ids, 10)
	if err := eng.Abort(ctx, aborted); err != nil {
		return err
	}
	s.fault("the engine stops reading its stream")
	eng.PauseReading()
	sends := p.Deliver(ctx, without(ids, aborted), 64)
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	eng.ResumeReading()
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	end, _ := eng.streamEnd(ectx)
	cancel()
	s.check(status.Code(end) == codes.ResourceExhausted && strings.Contains(end.Error(), "slow consumer"),
		"the engine's stream ended %v, want RESOURCE_EXHAUSTED slow consumer", end)
	if bad, some := failedSends(sends); bad > 0 {
		s.check(false, "%d rooms failed while their engine did not read: %s", bad, some)
	}
	if err := eng.Reconnect(ctx); err != nil {
		return err
	}
	wctx, stop := eng.whileStreamUp(ctx)
	err = eng.waitSettled(wctx)
	stop()
	if err != nil {
		if end, ended := eng.streamEnd(wctx); ended {
			return fmt.Errorf("the new stream ended too (%v): %w", end, err)
		}
		return err
	}
	s.note("stream cut: %v", end)
	return nil
}

// openPaced opens the rooms in batches, each admitted before the next, so
// that the engine, reading, keeps up with the opening's events: thousands
// of opens at once queue more events than its session holds (4096) before
// it can read them, on a small window or a loaded machine. A batch that does not reach ADMITTED within 20 s, or a
// stream cut meanwhile, is an error that says so.
func openPaced(ctx context.Context, eng *Engine, reqs []*pb.OpenRoomRequest) error {
	for batch := range slices.Chunk(reqs, 200) {
		ids := make([]uint64, len(batch))
		for i, q := range batch {
			ids[i] = q.GetRoom()
		}
		bctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := eng.Open(bctx, batch)
		if err == nil {
			err = eng.waitPhase(bctx, ids, pb.RoomPhase_ROOM_PHASE_ADMITTED)
		}
		cancel()
		if err != nil {
			done, stop := context.WithCancel(ctx)
			stop()
			if end, ended := eng.streamEnd(done); ended {
				return fmt.Errorf("opening the rooms while the engine still read: its stream ended (%v): %w", end, err)
			}
			return err
		}
	}
	return nil
}

// slowPrefill: a rank claims every room on a raw PrefillSession and reads
// nothing; the daemon cuts the session; the rank's Go client delivers
// every room on a new session.
func slowPrefill(ctx context.Context, s *Stage) error {
	n := s.rooms()
	d, err := s.startDaemon(ctx, "decodeplane", baseSets("admission.reserved_decode_tokens=0",
		fmt.Sprintf("kv_pool.total_pages=%d", 2*n*roomPages), fmt.Sprintf("kv_pool.request_slots=%d", 2*n))...)
	if err != nil {
		return err
	}
	p, err := s.newPrefill(ctx, d, prefillSpec{addr: "10.41.0.1:8998", instance: "prefill"})
	if err != nil {
		return err
	}
	eng, err := s.newEngine(ctx, "engine", d, true)
	if err != nil {
		return err
	}
	ids := roomIDs(1_000_000, n)
	if err := openPaced(ctx, eng, opens(p.spec.addr, ids)); err != nil {
		return err
	}
	conn, err := s.smallWindows(d.Addr)
	if err != nil {
		return err
	}
	s.fault("a prefill rank claims every room on its session and stops reading")
	end, delivered, err := claimWithoutReading(ctx, conn, p, ids)
	if err != nil {
		return err
	}
	s.check(status.Code(end) == codes.ResourceExhausted && strings.Contains(end.Error(), "slow consumer"),
		"the prefill's session ended %v, want RESOURCE_EXHAUSTED slow consumer", end)
	s.progress("session cut; %d destinations had been sent", delivered)
	if err := s.checkPages(ctx, d, false); err != nil {
		return err
	}
	aborted := every(ids, 10)
	if err := eng.Abort(ctx, aborted); err != nil {
		return err
	}
	s.progress("aborted %d rooms; the rank's new session delivers the rest", len(aborted))
	if bad, some := failedSends(p.Deliver(ctx, without(ids, aborted), 64)); bad > 0 {
		s.check(false, "%d rooms failed after the session was cut: %s", bad, some)
	}
	s.note("session cut after %d destinations were read back: %v", delivered, end)
	return nil
}

// settled waits until metric (a counter of the daemon's work) stops
// moving: two readings 250 ms apart that agree. It is how the suite knows
// the daemon is done with what it was sent on a stream it does not read.
func settled(ctx context.Context, d *Daemon, metric string) error {
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	last := -1.0
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		v, err := d.metric(wctx, metric)
		if err != nil {
			return err
		}
		if v == last {
			return nil
		}
		last = v
		select {
		case <-t.C:
		case <-wctx.Done():
			return fmt.Errorf("%s never settled: %w", metric, wctx.Err())
		}
	}
}

// claimWithoutReading opens a PrefillSession for p's rank 0 (no packing)
// and claims every room in ids four times (a claim supersedes the one
// before: its result, the earlier claim's end and the destination again)
// without reading — thousands of small messages, more than the queue and
// the transport's buffers hold; once the daemon is done with them it reads
// what was sent until the stream ends. It returns the stream's end and how many
// destinations it read.
func claimWithoutReading(ctx context.Context, conn *grpc.ClientConn, p *Prefill, ids []uint64) (error, int, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := pb.NewPrefillSessionClient(conn).Session(sctx)
	if err != nil {
		return nil, 0, err
	}
	rank := p.ranks[0]
	inc := rank.Incarnation()
	if err := st.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: rank.Rank(), InstanceId: p.spec.instance, Incarnation: inc}}}); err != nil {
		return nil, 0, err
	}
	if ev, err := st.Recv(); err != nil || ev.GetWelcome() == nil {
		return nil, 0, fmt.Errorf("PrefillSession hello: %v, %v", ev, err)
	}
	// The claims are sent from their own goroutine: once the daemon stops
	// reading them (it cut the session), a Send waits for flow control
	// until this side reads the stream, and the daemon's status waits
	// behind the destinations queued to it.
	sent := make(chan struct{})
	defer func() { cancel(); <-sent }()
	go func() {
		defer close(sent)
		seq := uint64(0)
		for range 4 {
			for _, id := range ids {
				seq++
				if err := st.Send(&pb.PrefillRequest{Seq: seq, Op: &pb.PrefillRequest_Claim{Claim: &pb.AwaitDestinationRequest{Room: id, Incarnation: inc}}}); err != nil {
					return // the daemon cut the stream: its status comes from Recv
				}
			}
		}
	}()
	if err := settled(ctx, p.d, "decodeplane_prefill_session_ops_total"); err != nil {
		return nil, 0, err
	}
	dests := 0
	for {
		ev, err := st.Recv()
		if err != nil {
			return err, dests, nil
		}
		if ev.GetRoom().GetEvent().GetDestination() != nil {
			dests++
		}
		for _, m := range ev.GetMore() {
			if m.GetRoom().GetEvent().GetDestination() != nil {
				dests++
			}
		}
	}
}

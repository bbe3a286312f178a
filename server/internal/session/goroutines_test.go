package session_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// sessions are an engine session and a prefill session of one rank,
// driven op by op.
type sessions struct {
	t              *testing.T
	addr           string
	eng            pb.EngineSession_SessionClient
	pre            pb.PrefillSession_SessionClient
	engSeq, preSeq uint64
}

// open opens rooms [from, from+n) on the engine session, each subscribed,
// and reads the reply and each room's first event.
func (s *sessions) open(from, n uint64) {
	s.t.Helper()
	s.engSeq++
	o := &pb.EngineOpen{}
	for r := from; r < from+n; r++ {
		o.Rooms = append(o.Rooms, &pb.OpenRoomRequest{Rid: fmt.Sprint(r), BootstrapAddr: s.addr, Room: r, PromptLen: 100, MaxNewTokens: 4})
	}
	if err := s.eng.Send(&pb.EngineRequest{Seq: s.engSeq, Op: &pb.EngineRequest_Open{Open: o}}); err != nil {
		s.t.Fatal(err)
	}
	for replied, events := false, uint64(0); !replied || events < n; {
		ev, err := s.eng.Recv()
		if err != nil {
			s.t.Fatal(err)
		}
		for _, e := range append([]*pb.EngineEvent{ev}, ev.GetMore()...) {
			if r := e.GetReply(); r != nil {
				for _, res := range r.GetResults() {
					if res.GetCode() != 0 {
						s.t.Fatalf("open of room %d: %v", res.GetRoom(), res)
					}
				}
				replied = true
			}
			if e.GetRoom().GetSeq() == 1 {
				events++
			}
		}
	}
}

// prefill sends ops on the prefill session, then a ping, and reads until
// results results, destinations destinations and the pong came: the
// session ran every op.
func (s *sessions) prefill(ops []*pb.PrefillRequest, results, destinations int) map[uint64]*pb.Destination {
	s.t.Helper()
	for _, m := range ops {
		s.preSeq++
		m.Seq = s.preSeq
		if err := s.pre.Send(m); err != nil {
			s.t.Fatal(err)
		}
	}
	if err := s.pre.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Ping{Ping: &pb.PrefillPing{}}}); err != nil {
		s.t.Fatal(err)
	}
	dests := map[uint64]*pb.Destination{}
	for pong := false; !pong || results > 0 || len(dests) < destinations; {
		ev, err := s.pre.Recv()
		if err != nil {
			s.t.Fatal(err)
		}
		for _, e := range append([]*pb.PrefillEvent{ev}, ev.GetMore()...) {
			if r := e.GetResult(); r != nil {
				if r.GetError() != nil {
					s.t.Fatalf("op %d: %v", r.GetSeq(), r.GetError())
				}
				results--
			}
			if dst := e.GetRoom().GetEvent().GetDestination(); dst != nil {
				dests[e.GetRoom().GetRoom()] = dst
			}
			pong = pong || e.GetPong() != nil
		}
	}
	return dests
}

// claimsAndChunks claims rooms [from, from+n), open, each then sent a
// chunk that stays in flight, and rooms [later, later+n), not opened yet.
func (s *sessions) claimsAndChunks(from, later, n uint64) {
	s.t.Helper()
	var claims []*pb.PrefillRequest
	for r := from; r < from+n; r++ {
		claims = append(claims, &pb.PrefillRequest{Op: &pb.PrefillRequest_Claim{Claim: &pb.AwaitDestinationRequest{Room: r}}})
	}
	for r := later; r < later+n; r++ {
		claims = append(claims, &pb.PrefillRequest{Op: &pb.PrefillRequest_Claim{Claim: &pb.AwaitDestinationRequest{Room: r}}})
	}
	var chunks []*pb.PrefillRequest
	for r, dst := range s.prefill(claims, int(2*n), int(n)) {
		chunks = append(chunks, &pb.PrefillRequest{Op: &pb.PrefillRequest_Chunk{Chunk: &pb.TransferRequest{Room: r, NumPages: 1,
			Attempt: dst.GetAttempt(), Incarnation: dst.GetIncarnation()}}})
	}
	s.prefill(chunks, 0, 0)
}

// TestSessionGoroutinesDoNotGrowWithTheirRooms: a session runs on a fixed
// number of goroutines (the handler's, one receiving, one sending),
// however many rooms it claims, watches or moves chunks for. With an
// engine session watching n rooms and a prefill session holding n claims
// of open rooms (each with a chunk in flight) and n claims of rooms not
// opened yet, the daemon and its clients run as many goroutines as with
// one room of each kind.
func TestSessionGoroutinesDoNotGrowWithTheirRooms(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Sim.Latency = time.Hour // the chunks stay in flight until their session ends
		c.Timeouts.HeartbeatInterval = time.Hour
		c.Timeouts.Bootstrap = time.Hour
	}})
	conn := d.Conn(t)
	s := &sessions{t: t, addr: "p1:1"}
	if _, err := pb.NewBootstrapClient(conn).RegisterPrefill(ctx, &pb.RegisterPrefillRequest{BootstrapAddr: s.addr, RankEndpoint: "10.0.0.1:9000",
		Parallel: &pb.ParallelInfo{AttnTpSize: 1, AttnCpSize: 1, AttnDpSize: 1, PpSize: 1}, PageSize: 64, KvCacheDtype: "bf16"}); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	var err error
	if s.eng, err = pb.NewEngineSessionClient(conn).Session(ctx); err != nil {
		t.Fatal(err)
	}
	if s.pre, err = pb.NewPrefillSessionClient(conn).Session(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.pre.Send(&pb.PrefillRequest{Op: &pb.PrefillRequest_Hello{Hello: &pb.PrefillHello{Rank: &pb.PrefillRank{BootstrapAddr: s.addr}}}}); err != nil {
		t.Fatal(err)
	}
	if ev, err := s.pre.Recv(); err != nil || ev.GetWelcome() == nil {
		t.Fatalf("hello = %v, %v", ev, err)
	}
	// One room of each kind, then n more.
	s.open(1, 1)
	s.claimsAndChunks(1, 1000, 1)
	one := runtime.NumGoroutine()
	const n = 64
	s.open(2, n)
	s.claimsAndChunks(2, 2000, n)
	many := runtime.NumGoroutine()
	t.Logf("goroutines: %d before the sessions, %d with one room of each kind, %d with %d more (the daemon and its client, both sessions)", before, one, many, n)
	if many-one > 4 {
		t.Errorf("%d goroutines with %d more rooms watched, claimed and moving a chunk, %d with one: the sessions' goroutines grow with their rooms", many, n, one)
	}
}

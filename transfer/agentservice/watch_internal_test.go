package agentservice

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
)

// TestWatchBufferBoundedByReplay: a WatchCompletions stream's channel grows
// with the completions it replays, at most completionBuffer more, and not
// with the ids the request names (up to 2^20, which made a channel of as
// many slots per watch).
func TestWatchBufferBoundedByReplay(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(64 << 20))
	svc := New(hostmem.NewAgent(hostmem.New(1<<20)), slog.New(slog.DiscardHandler))
	svc.Register(gs)
	served := make(chan error, 1)
	go func() { served <- gs.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///bufnet", grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		svc.Close()
		gs.Stop()
		<-served
	})
	api := transferv1.NewTransferAgentClient(conn)

	// Finished batches the watches may replay.
	const finished = completionBuffer + 904
	svc.mu.Lock()
	for i := range finished {
		id := fmt.Sprintf("done-%d", i)
		svc.batches[id] = &batchRecord{completion: &transferv1.Completion{BatchId: id}}
	}
	svc.mu.Unlock()

	ids := func(known, unknown int) []string {
		out := make([]string, 0, known+unknown)
		for i := range known {
			out = append(out, fmt.Sprintf("done-%d", i))
		}
		for i := range unknown {
			out = append(out, fmt.Sprintf("gone-%d", i))
		}
		return out
	}
	for _, tt := range []struct {
		name           string
		known, unknown int
		wantCap        int
	}{
		{"2^16 unknown ids", 0, 1 << 16, completionBuffer},
		{"100 replayed among 2^16 ids", 100, 1<<16 - 100, completionBuffer + 100},
		{"more replayed than the headroom", finished, 0, 2 * completionBuffer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			// The previous subtest's watch may not be gone yet: this one's is
			// the watch that was not there before.
			before := map[*completionWatch]bool{}
			svc.mu.Lock()
			for w := range svc.watches {
				before[w] = true
			}
			svc.mu.Unlock()
			stream, err := api.WatchCompletions(ctx, &transferv1.WatchCompletionsRequest{ReplayBatchIds: ids(tt.known, tt.unknown)})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 1 + tt.known { // the hello, then the replay
				if _, err := stream.Recv(); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			svc.mu.Lock()
			var caps []int
			for w := range svc.watches {
				if !before[w] {
					caps = append(caps, cap(w.ch))
				}
			}
			svc.mu.Unlock()
			if len(caps) != 1 || caps[0] != tt.wantCap {
				t.Errorf("watch channel capacities %v, want [%d]", caps, tt.wantCap)
			}
		})
	}
}

package agentservice_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"

	transferv1 "github.com/decodeplane/decodeplane/proto/decodeplane/transfer/v1"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// syncLog collects a text handler's lines.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) lines(msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, s := range strings.Split(l.b.String(), "\n") {
		if strings.Contains(s, `msg="`+msg+`"`) {
			out = append(out, s)
		}
	}
	return out
}

// TestBatchFailureStorm: 1,000 batches failing at once (an agent whose
// every batch fails) write two lines: the first batch's failure at once,
// and a summary counting the other 999 when the service closes — not a
// line per batch. Each batch's outcome still reaches its completion.
func TestBatchFailureStorm(t *testing.T) {
	var logs syncLog
	agent := hostmem.NewAgent(hostmem.New(1 << 20))
	agent.SetFault(func(b kvcopy.Batch) error { return fmt.Errorf("injected fault: batch %s refused", b.ID) })
	svc := agentservice.New(agent, slog.New(slog.NewTextHandler(&logs, nil)))
	const n = 1000
	for i := range n {
		if _, err := svc.SubmitBatch(context.Background(), &transferv1.SubmitBatchRequest{BatchId: fmt.Sprint("b-", i), Room: uint64(i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	svc.Close() // waits for the batches, then writes the pending summary
	got := logs.lines("batch failed")
	if len(got) != 2 || strings.Contains(got[0], "count=") || !strings.Contains(got[1], fmt.Sprintf("count=%d", n-1)) {
		t.Fatalf("batch failed lines %q, want the first batch's and a summary counting %d", got, n-1)
	}
	if !strings.Contains(got[0], "injected fault") || !strings.Contains(got[1], "first.err=") {
		t.Errorf("lines %q do not name the error", got)
	}
}

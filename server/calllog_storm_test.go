package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
)

// TestFailedCallStorm: 1,000 calls failing the same way (same method, same
// code) write two lines — the first at once, with its own error, and a
// summary counting the other 999 written when the server stops — and a
// call failing another way has its own line.
func TestFailedCallStorm(t *testing.T) {
	ts := startAt(t, nil, slog.LevelInfo)
	ctx := ctxT(t)
	for range 1000 {
		if err := ts.conn.Invoke(ctx, "/"+probeService+"/Panic", &emptypb.Empty{}, &emptypb.Empty{}); status.Code(err) != codes.Internal {
			t.Fatalf("Panic = %v, want Internal", err)
		}
	}
	lines := func(msg string) []string {
		var out []string
		for _, l := range strings.Split(ts.log.String(), "\n") {
			if strings.Contains(l, `msg="`+msg+`"`) {
				out = append(out, l)
			}
		}
		return out
	}
	if got := lines("finished call"); len(got) != 1 || !strings.Contains(got[0], "grpc.method=Panic") || strings.Contains(got[0], "count=") {
		t.Fatalf("during the storm: finished-call lines %q, want the first call's alone", got)
	}
	if got := lines("panic in gRPC handler"); len(got) != 1 || !strings.Contains(got[0], "stack=") {
		t.Fatalf("during the storm: panic lines %q, want the first one's, with its stack", got)
	}
	ctx2, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := ts.s.Shutdown(ctx2, nil); err != nil {
		t.Fatal(err)
	}
	<-ts.serve
	ts.serve <- nil // for the cleanup's Shutdown
	got := lines("finished call")
	if len(got) != 2 || !strings.Contains(got[1], "count=999") || !strings.Contains(got[1], "grpc.code=Internal") {
		t.Errorf("after the server stopped: finished-call lines %q, want the first and a summary counting 999", got)
	}
	if got := lines("panic in gRPC handler"); len(got) != 2 || !strings.Contains(got[1], "count=999") {
		t.Errorf("after the server stopped: panic lines %q, want the first and a summary counting 999", got)
	}
}

package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestBenchEngineSessionEndFailsRoomsAndReopens cuts the engine session
// under a waiting room: the room fails with the session's end as its
// reason, and the next room gets a new session that works.
func TestBenchEngineSessionEndFailsRoomsAndReopens(t *testing.T) {
	d := daemontest.Start(t, daemontest.Options{TCP: true})
	c, err := client.New(d.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	e := newBenchEngine(c, func() int64 { return max(1, int64(time.Since(start))) }, true)
	defer e.close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	es, err := e.session()
	if err != nil {
		t.Fatal(err)
	}
	w, err := es.subscribe(42)
	if err != nil {
		t.Fatal(err)
	}
	es.s.Close() // the stream ends under the room, as a slow consumer's would
	err = w.waitSucceeded(ctx, 42)
	if !errors.Is(err, errBenchSessionEnded) {
		t.Fatalf("the waiting room got %v, want its session's end", err)
	}
	if r := benchReason(err); !strings.HasPrefix(r, "engine session ended: ") {
		t.Errorf("reason %q, want engine session ended: <code>", r)
	}
	if _, err := es.subscribe(43); !errors.Is(err, errBenchSessionEnded) {
		t.Errorf("subscribe on the ended session: %v, want its end", err)
	}

	es2, err := e.session()
	if err != nil {
		t.Fatal(err)
	}
	if es2 == es {
		t.Fatal("the ended session was handed out again")
	}
	// A round trip on the new session: an abort of a room that does not
	// exist is the daemon's NotFound, not the session's end.
	err = e.abort(ctx, &pb.AbortRoomRequest{Room: 4242, Reason: "test"})
	if !errors.Is(err, client.ErrNotFound) || es2.ended() {
		t.Errorf("abort on the new session: %v (ended %v), want NotFound on a live session", err, es2.ended())
	}
}

package main

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestE2EJaegerOneTracePerRoomOverSessions is TestE2EJaegerOneTracePerRoom
// on the streams transport (the Go client's default): the decode engine's
// OpenAndWait rides its EngineSession and the prefill rank's SendRoom its
// PrefillSession, and each request is still one trace in Jaeger. With no
// RPC per step there is no client span per call: the caller's trace
// context travels in each message, so the daemon's room span and its
// session-op spans ("…PrefillSession/Session/chunk", with the daemon's chunk
// spans under them) are children of the router's request span itself.
func TestE2EJaegerOneTracePerRoomOverSessions(t *testing.T) {
	j := startJaeger(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const bootstrap = "10.9.0.2:8998"
	f := startTracedFleet(t, ctx, j, client.TransportStreams, bootstrap)
	p, routerTP, decode, prefill := f.p, f.routerTP, f.decode, f.prefill

	// Two requests, each under its own router span, in flight together
	// on the same two sessions: each must stay one trace of its own.
	type req struct {
		room uint64
		rid  string
		id   trace.TraceID
		root func()
	}
	var reqs []req
	done := make(chan error, 4)
	for _, room := range []uint64{201, 202} {
		rctx, root := routerTP.Tracer("router").Start(ctx, "router.request")
		r := req{room: room, rid: fmt.Sprintf("traced-session-%d", room), id: root.SpanContext().TraceID(), root: func() { root.End() }}
		reqs = append(reqs, r)
		go func() {
			_, err := prefill.SendRoom(rctx, room, client.SendOptions{ChunkPages: 2})
			done <- err
		}()
		go func() {
			_, err := decode.Engine().OpenAndWait(rctx, &pb.OpenRoomRequest{Rid: r.rid, BootstrapAddr: bootstrap, Room: room, PromptLen: 300, MaxNewTokens: 16})
			done <- err
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, r := range reqs {
		if _, err := decode.Engine().ReleaseRoom(ctx, &pb.ReleaseRoomRequest{Room: r.room}); err != nil {
			t.Fatal(err)
		}
		r.root()
	}

	p.Cmd.Process.Signal(syscall.SIGTERM)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("daemon exit code %d; output:\n%s", code, p.Out.String())
	}

	const chunkOp = "decodeplane.v1.PrefillSession/Session/chunk"
	for _, r := range reqs {
		var spans []span
		complete := func() bool {
			return len(find(spans, "decodeplane", "room")) == 1 && len(find(spans, "decodeplane", "chunk")) == 3 && len(find(spans, "decodeplane", chunkOp)) == 3
		}
		deadline := time.NewTimer(30 * time.Second)
		tick := time.NewTicker(50 * time.Millisecond) // Jaeger's ingestion: polled, as poll does
		for spans = j.trace(t, r.id); !complete(); spans = j.trace(t, r.id) {
			select {
			case <-tick.C:
				continue
			case <-deadline.C:
			}
			break
		}
		tick.Stop()
		deadline.Stop()
		if !complete() {
			t.Fatalf("room %s's trace in Jaeger, after 30s: want one room span, 3 chunk spans and 3 %s spans; have:\n%s", r.rid, chunkOp, describe(spans))
		}
		roots := find(spans, "router", "router.request")
		if len(roots) != 1 {
			t.Fatalf("%s: %d router spans in its trace, want 1:\n%s", r.rid, len(roots), describe(spans))
		}
		room := find(spans, "decodeplane", "room")[0]
		if room.parent != roots[0].id || room.tags["decodeplane.rid"] != r.rid || room.tags["otel.status_code"] != "OK" {
			t.Errorf("%s: room span parent %s (router span %s), tags %v; want under the router's request, its rid, OK:\n%s",
				r.rid, room.parent, roots[0].id, room.tags, describe(spans))
		}
		for _, c := range find(spans, "decodeplane", "chunk") {
			op, ok := byID(spans, c.parent)
			if !ok || op.name != chunkOp {
				t.Errorf("%s: chunk span's parent %+v, want the session's chunk op span:\n%s", r.rid, op, describe(spans))
				continue
			}
			if op.parent != roots[0].id {
				t.Errorf("%s: the chunk op span's parent is %s, want the router's request span %s", r.rid, op.parent, roots[0].id)
			}
		}
		// Nothing of the other request leaked into this trace.
		for _, s := range find(spans, "decodeplane", "room") {
			if s.tags["decodeplane.rid"] != r.rid {
				t.Errorf("%s's trace holds the room span of %s", r.rid, s.tags["decodeplane.rid"])
			}
		}
	}
}

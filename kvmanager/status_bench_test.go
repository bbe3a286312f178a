package kvmanager

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// BenchmarkStatusQueued: Status (what GetStatus and every /metrics scrape
// read, under the manager's lock) with queuedRooms rooms queued behind a
// one-slot pool, as BenchmarkQueuedRoomMemory queues them.
func BenchmarkStatusQueued(b *testing.B) {
	dec := kvlayout.DefaultConfig()
	oneSlot(&dec)
	dec.Admission.MaxQueued = 2 * queuedRooms
	dec.Admission.ClaimTimeout = time.Hour
	cfg := DefaultConfig()
	cfg.Timeouts.Bootstrap = time.Hour
	m := benchManager(b, dec, cfg)
	benchRegister(b, m, dec)
	ctx := context.Background()
	for i := range queuedRooms + 1 {
		if _, _, err := m.OpenRoom(ctx, OpenRequest{RID: fmt.Sprintf("rid-%d", i), Addr: addrA, Room: uint64(i + 1), PrefillDP: -1, DecodeDP: -1, PromptLen: 1000, MaxNewTokens: 128}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for b.Loop() {
		st := m.Status()
		if st.RoomsByPhase[PhaseQueued] != queuedRooms {
			b.Fatalf("%d rooms queued, want %d", st.RoomsByPhase[PhaseQueued], queuedRooms)
		}
	}
	b.StopTimer()
	m.Shutdown(endedContext())
}

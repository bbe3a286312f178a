package bench

import (
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The last chunk -> engine told delay of a room: from just before its last
// chunk is sent (the latest of its prefill ranks' last chunks: the room
// cannot succeed before every rank's last chunk is in) to the moment the
// decode engine learns ROOM_PHASE_SUCCEEDED (the WatchRoom stream, or the
// engine session's waiter, returning). Both ends are read on the run's
// monotonic clock (benchRun.now) in this process. The start is taken in the
// client's SendOptions.Source callback, which SendRoom and SendRoomSession
// call for every chunk just before they send it, on both apis; the bench
// returns no source (the simulated path needs none).

// chunkStamp is the room's SendOptions.Source: it records when each rank's
// last chunk is about to be sent, keeping the latest.
func (b *benchRun) chunkStamp(st *benchRoomState) func(client.Chunk) *pb.TransferSource {
	return func(ch client.Chunk) *pb.TransferSource {
		if ch.Last {
			now := b.now()
			for {
				cur := st.lastChunk.Load()
				if cur >= now || st.lastChunk.CompareAndSwap(cur, now) {
					break
				}
			}
		}
		return nil
	}
}

// chunkToTold records a successful room's last chunk -> engine told delay
// (tSucc: when the engine side saw Success). A room whose ranks sent no
// chunk (only dummy destinations) has none.
func (r *benchRecorder) chunkToTold(st *benchRoomState, tSucc int64) {
	last := st.lastChunk.Load()
	if last == 0 {
		return
	}
	r.mu.Lock()
	r.chunkTold = append(r.chunkTold, time.Duration(tSucc-last))
	r.mu.Unlock()
}

// benchSize is a message's size on the wire (0 for what is not a protobuf
// message).
func benchSize(m any) int64 {
	if pm, ok := m.(proto.Message); ok {
		return int64(proto.Size(pm))
	}
	return 0
}

package session

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestPackCount: the engine session packs at most 64 events per message
// and stops before the packed replies pass the byte budget (a Watch's
// reply of 4,096 rooms is ~50 KiB: 65 of them packed would pass gRPC's
// 4 MiB default limit), a reply larger than the budget going alone.
func TestPackCount(t *testing.T) {
	watchReply := func(rooms int, msg string) *pb.EngineEvent {
		r := &pb.EngineReply{Seq: 1}
		for i := range rooms {
			r.Results = append(r.Results, &pb.EngineResult{Room: uint64(i + 1), Code: 5, Message: msg})
		}
		return &pb.EngineEvent{Event: &pb.EngineEvent_Reply{Reply: r}}
	}
	room := &pb.EngineEvent{Event: &pb.EngineEvent_Room{Room: &pb.EngineRoomEvent{Room: 1, Seq: 1}}}
	big := watchReply(4096, "room 1234567 not found (retained rooms only)")
	size := proto.Size(big.GetReply())
	queue := make([]*pb.EngineEvent, 65)
	for i := range queue {
		queue[i] = big
	}
	want := pb.MaxSessionMessageBytes / size
	if n := packCount(queue); n != want || n*size > pb.MaxSessionMessageBytes {
		t.Errorf("packCount(65 replies of %d bytes) = %d, want %d (within %d bytes)", size, n, want, pb.MaxSessionMessageBytes)
	}
	for i := range queue {
		queue[i] = room
	}
	if n := packCount(queue); n != pb.MaxEngineEventsPerMessage {
		t.Errorf("packCount(65 room events) = %d, want %d", n, pb.MaxEngineEventsPerMessage)
	}
	huge := watchReply(4096, string(make([]byte, 300)))
	if proto.Size(huge.GetReply()) <= pb.MaxSessionMessageBytes {
		t.Fatal("the huge reply is not beyond the budget")
	}
	if n := packCount([]*pb.EngineEvent{huge, room, room}); n != 1 {
		t.Errorf("packCount(a reply beyond the budget, ...) = %d, want 1 (it goes alone)", n)
	}
	if n := packCount([]*pb.EngineEvent{room, huge}); n != 1 {
		t.Errorf("packCount(a room event, then a reply beyond the budget) = %d, want 1", n)
	}
}

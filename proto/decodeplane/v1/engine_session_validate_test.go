package decodeplanev1

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestEngineRequestCheckProtocol(t *testing.T) {
	open := &EngineRequest_Open{Open: &EngineOpen{}}
	for _, tc := range []struct {
		req  *EngineRequest
		prev uint64
		want string
	}{
		{&EngineRequest{Seq: 1, Op: open}, 0, ""},
		{&EngineRequest{Seq: 8, Op: open}, 7, ""},
		{&EngineRequest{Seq: 0, Op: open}, 0, "seq: must be > 0"},
		{&EngineRequest{Seq: 7, Op: open}, 7, "seq: 7 is not above the previous request's seq 7"},
		{&EngineRequest{Seq: 3, Op: open}, 7, "seq: 3 is not above"},
		{&EngineRequest{Seq: 9}, 7, "op: is required"},
	} {
		err := tc.req.CheckProtocol(tc.prev)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.want)) {
			t.Errorf("CheckProtocol(%v, prev %d) = %v, want %q", tc.req, tc.prev, err, tc.want)
		}
	}
}

func TestCheckTraceparent(t *testing.T) {
	good := []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future"}
	bad := []string{
		"00-zz", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero span id
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x", // extra field in version 00
		strings.Repeat("a", MaxTraceparentLen+1),
	}
	for _, tp := range good {
		if err := checkTraceparent("traceparent", tp); err != nil {
			t.Errorf("checkTraceparent(%q) = %v, want nil", tp, err)
		}
	}
	for _, tp := range bad {
		if err := checkTraceparent("traceparent", tp); err == nil || !strings.HasPrefix(err.Error(), "traceparent: ") {
			t.Errorf("checkTraceparent(%.30q) = %v, want an error naming traceparent", tp, err)
		}
	}
}

// engineOp is EngineRequest with CheckOp as its Validate, for fuzzValidate.
type engineOp struct{ *EngineRequest }

func (e engineOp) Validate() error { return e.CheckOp() }

func FuzzEngineRequest(f *testing.F) {
	room := &OpenRoomRequest{Rid: "r", BootstrapAddr: "10.0.0.1:8998", Room: 1, PromptLen: 10, MaxNewTokens: 4}
	seeds := []engineOp{
		{&EngineRequest{Seq: 1, Op: &EngineRequest_Open{Open: &EngineOpen{Rooms: []*OpenRoomRequest{room, room}, Traceparents: []string{"", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}}}},
		{&EngineRequest{Seq: 2, Op: &EngineRequest_Watch{Watch: &EngineWatch{Rooms: []*EngineWatchRoom{{Room: 1, After: 3}, {Room: 1}}}}}},
		{&EngineRequest{Seq: 3, Op: &EngineRequest_Abort{Abort: &AbortRoomRequest{Room: 1}}, Traceparent: "00-zz"}},
	}
	fuzzValidate(f, func() engineOp { return engineOp{&EngineRequest{}} }, func(b *bounds, m engineOp) {
		b.need(len(m.GetTraceparent()) <= 128, "traceparent at most 128 bytes")
		switch op := m.GetOp().(type) {
		case *EngineRequest_Open:
			n := len(op.Open.GetRooms())
			b.need(n >= 1 && n <= 256, "open.rooms 1..256")
			tps := op.Open.GetTraceparents()
			b.need(len(tps) == 0 || len(tps) == n, "open.traceparents empty or one per room")
			seen := map[uint64]bool{}
			for _, r := range op.Open.GetRooms() {
				b.need(r.GetRoom() == 0 || !seen[r.GetRoom()], "open.rooms no room twice")
				seen[r.GetRoom()] = true
			}
		case *EngineRequest_Watch:
			n := len(op.Watch.GetRooms())
			b.need(n >= 1 && n <= 4096, "watch.rooms 1..4096")
			seen := map[uint64]bool{}
			for _, r := range op.Watch.GetRooms() {
				b.need(roomOK(r.GetRoom()) && !seen[r.GetRoom()], "watch.rooms[i].room 1..2^63-1, once")
				seen[r.GetRoom()] = true
			}
		}
	}, seeds...)
}

// engineOp must marshal as the request it wraps.
var _ proto.Message = engineOp{}

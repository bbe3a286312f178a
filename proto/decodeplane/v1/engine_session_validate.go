package decodeplanev1

import (
	"errors"
	"fmt"
	"strings"
)

// Bounds of EngineSession.Session (engine_session.proto).
//
// EngineRequest has no Validate method on purpose: the server's interceptor
// would end the stream on any bad message, and only a protocol violation
// (CheckProtocol) ends it; the op's checks (CheckOp, then each embedded
// request's own Validate, the unary RPC's) answer in the op's Reply.
const (
	// MaxEngineOpenRooms bounds EngineOpen.rooms (a scheduler step's batch).
	MaxEngineOpenRooms = 256
	// MaxEngineWatchRooms bounds EngineWatch.rooms.
	MaxEngineWatchRooms = 4096
	// MaxTraceparentLen bounds EngineRequest.traceparent and
	// EngineOpen.traceparents (a version-00 traceparent is 55 bytes).
	MaxTraceparentLen = 128
	// MaxEngineSessionQueue is the bound of a stream's outgoing queue
	// (events and replies); a stream whose queue is full is cut with
	// RESOURCE_EXHAUSTED (a slow consumer).
	MaxEngineSessionQueue = 4096
	// MaxEngineSessionRooms bounds the rooms one stream is subscribed to.
	MaxEngineSessionRooms = 16384
	// MaxEngineRequestsPerMessage bounds EngineRequest.more.
	MaxEngineRequestsPerMessage = 64
	// MaxEngineEventsPerMessage bounds EngineEvent.more (what the daemon
	// packs into one message).
	MaxEngineEventsPerMessage = 64
	// MaxSessionMessageBytes is the packing budget of both sessions, both
	// ways: entries are packed into a message while it stays about this
	// size (a single entry larger than it goes alone), well below gRPC's
	// default 4 MiB message limit.
	MaxSessionMessageBytes = 1 << 20
)

// Packing is negotiated per stream, in gRPC metadata, both sessions alike
// (engine_session.proto and prefill_session.proto, "Packing"): a client
// whose request metadata carries PackKey: PackMore reads the daemon's
// packed messages (EngineEvent.more, PrefillEvent.more), and the daemon
// packs only for such a client; the daemon reads packed requests always
// and says so in its response header (PackKey: PackMore, sent when the
// stream starts), and a client packs its requests only once it saw that
// header (a daemon without it would drop the entries of more unread).
const (
	PackKey  = "decodeplane-pack"
	PackMore = "more"
)

// CheckBatch checks a message's more (before its requests, each then
// checked with CheckProtocol in order): at most
// MaxEngineRequestsPerMessage entries, none with a more of its own. An
// error names the field; the server ends the stream with it.
func (x *EngineRequest) CheckBatch() error {
	more := x.GetMore()
	if len(more) > MaxEngineRequestsPerMessage {
		return fieldErr("more", "has %d requests (at most %d per message)", len(more), MaxEngineRequestsPerMessage)
	}
	for i, m := range more {
		if len(m.GetMore()) > 0 {
			return fieldErr(fmt.Sprintf("more[%d].more", i), "must be empty (requests are not nested)")
		}
	}
	return nil
}

// checkEngineEvents checks an EngineEvents field.
func checkEngineEvents(field string, e EngineEvents) error {
	if _, ok := EngineEvents_name[int32(e)]; !ok {
		return fieldErr(field, "%d is not an EngineEvents value (ENGINE_EVENTS_ALL 0, ENGINE_EVENTS_OUTCOME 1)", int32(e))
	}
	return nil
}

// CheckProtocol checks what a stream cannot go on without: a seq above
// prev (the previous request's seq, 0 before the first) and an op. An
// error names the field (seq or op); the server ends the stream with it.
func (x *EngineRequest) CheckProtocol(prev uint64) error {
	switch {
	case x.GetSeq() == 0:
		return fieldErr("seq", "must be > 0 (a client-chosen sequence, strictly increasing on the stream)")
	case x.GetSeq() <= prev:
		return fieldErr("seq", "%d is not above the previous request's seq %d (seq must strictly increase on the stream)", x.GetSeq(), prev)
	case x.GetOp() == nil:
		return fieldErr("op", "is required: one of open, release, abort, watch")
	}
	return nil
}

// CheckOp checks the op as a whole (not the embedded unary requests,
// whose Validate the server calls per room): the batch sizes, no room
// twice, the trace contexts. An error names the field path.
func (x *EngineRequest) CheckOp() error {
	errs := []error{checkTraceparent("traceparent", x.GetTraceparent())}
	switch op := x.GetOp().(type) {
	case *EngineRequest_Open:
		rooms := op.Open.GetRooms()
		switch n := len(rooms); {
		case n == 0:
			errs = append(errs, fieldErr("open.rooms", "is empty: open 1..%d rooms per request", MaxEngineOpenRooms))
		case n > MaxEngineOpenRooms:
			errs = append(errs, fieldErr("open.rooms", "has %d rooms (at most %d per request)", n, MaxEngineOpenRooms))
		}
		seen := make(map[uint64]int, len(rooms))
		for i, r := range rooms {
			if j, dup := seen[r.GetRoom()]; dup && r.GetRoom() != 0 {
				errs = append(errs, fieldErr(fmt.Sprintf("open.rooms[%d].room", i), "%d is also open.rooms[%d]: a room once per batch", r.GetRoom(), j))
				break
			}
			seen[r.GetRoom()] = i
		}
		if err := checkEngineEvents("open.events", op.Open.GetEvents()); err != nil {
			errs = append(errs, err)
		}
		tps := op.Open.GetTraceparents()
		if len(tps) != 0 && len(tps) != len(rooms) {
			errs = append(errs, fieldErr("open.traceparents", "has %d entries for %d rooms: empty or one per room", len(tps), len(rooms)))
		}
		for i, tp := range tps {
			if err := checkTraceparent(fmt.Sprintf("open.traceparents[%d]", i), tp); err != nil {
				errs = append(errs, err)
				break
			}
		}
	case *EngineRequest_Watch:
		if err := checkEngineEvents("watch.events", op.Watch.GetEvents()); err != nil {
			errs = append(errs, err)
		}
		rooms := op.Watch.GetRooms()
		switch n := len(rooms); {
		case n == 0:
			errs = append(errs, fieldErr("watch.rooms", "is empty: watch 1..%d rooms per request", MaxEngineWatchRooms))
		case n > MaxEngineWatchRooms:
			errs = append(errs, fieldErr("watch.rooms", "has %d rooms (at most %d per request)", n, MaxEngineWatchRooms))
		}
		seen := make(map[uint64]int, len(rooms))
		for i, r := range rooms {
			field := fmt.Sprintf("watch.rooms[%d].room", i)
			if err := checkRoom(field, r.GetRoom()); err != nil {
				errs = append(errs, err)
				break
			}
			if j, dup := seen[r.GetRoom()]; dup {
				errs = append(errs, fieldErr(field, "%d is also watch.rooms[%d]: a room once per request", r.GetRoom(), j))
				break
			}
			seen[r.GetRoom()] = i
		}
	case *EngineRequest_Release:
		if op.Release == nil {
			errs = append(errs, fieldErr("release", "is required"))
		}
	case *EngineRequest_Abort:
		if op.Abort == nil {
			errs = append(errs, fieldErr("abort", "is required"))
		}
	}
	return errors.Join(errs...)
}

// PrefixFields prefixes every line of a validation error (each names its
// field first) with prefix: OpenRoomRequest's "prompt_len: ..." becomes
// "open.rooms[3].prompt_len: ...".
func PrefixFields(prefix string, err error) error {
	if err == nil {
		return nil
	}
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return errors.New(strings.Join(lines, "\n"))
}

// checkTraceparent checks a W3C traceparent: empty, or at most
// MaxTraceparentLen bytes of "vv-<32 hex>-<16 hex>-<2 hex>" (lower-case
// hex; version ff is invalid; version 00 has exactly these four fields;
// neither id all zeros), as the W3C Trace Context specification reads it.
func checkTraceparent(field, tp string) error {
	if tp == "" {
		return nil
	}
	if len(tp) > MaxTraceparentLen {
		return fieldErr(field, "is %d bytes long (at most %d)", len(tp), MaxTraceparentLen)
	}
	parts := strings.Split(tp, "-")
	ok := len(parts) >= 4 && isHex(parts[0], 2) && parts[0] != "ff" && isHex(parts[1], 32) && isHex(parts[2], 16) && isHex(parts[3], 2) &&
		strings.Trim(parts[1], "0") != "" && strings.Trim(parts[2], "0") != "" && (parts[0] != "00" || len(parts) == 4)
	if !ok {
		return fieldErr(field, "%s is not a W3C traceparent (\"00-<32 hex trace id>-<16 hex span id>-<2 hex flags>\")", short(tp))
	}
	return nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

package prealloc

import "fmt"

// RoomState is where a room is in the ledger's lifecycle (see the package
// documentation for the transitions).
type RoomState uint8

// Room states.
const (
	// RoomWaiting: enqueued, handshake not done; holds nothing, keeps its
	// queue position, skipped by admission.
	RoomWaiting RoomState = iota + 1
	// RoomReady: handshake done; eligible for admission in queue order.
	RoomReady
	// RoomAdmitted: pre-allocated (req slot, metadata slot, pages, state);
	// waiting for every prefill rank to claim it.
	RoomAdmitted
	// RoomClaimed: claimed by prefill, KV transferring.
	RoomClaimed
	// RoomResumed: a retracted room whose pages an admission pass restored;
	// the engine reloads its CPU copy and calls StartRunning.
	RoomResumed
	// RoomRunning: decoding; grows through UpdateRunning.
	RoomRunning
	// RoomRetracted: retracted under KV pressure; holds nothing, resumed
	// first by the next admission passes.
	RoomRetracted
	// RoomHeld: retracted for rebootstrap (pause_generation retract mode);
	// holds nothing, re-enters the queue on ResumeHeld.
	RoomHeld
	// RoomDraining: ended (DrainRoom) while a prefill rank may still be
	// writing into its pages by itself. It is no longer a request: it is in
	// no queue or heap and no budget term of a live request, but it keeps
	// exactly its pages, SWA pages, req slot, state slots and, if it had
	// one, its metadata slot (prefill may still write the aux row) until
	// Release frees them. Those are not free: admission never hands them out.
	RoomDraining
)

var roomStateNames = [...]string{
	RoomWaiting:   "waiting",
	RoomReady:     "ready",
	RoomAdmitted:  "admitted",
	RoomClaimed:   "claimed",
	RoomResumed:   "resumed",
	RoomRunning:   "running",
	RoomRetracted: "retracted",
	RoomHeld:      "held",
	RoomDraining:  "draining",
}

// numRoomStates sizes per-state counters (index 0 unused).
const numRoomStates = int(RoomDraining) + 1

// String returns the state's name.
func (s RoomState) String() string {
	if s > 0 && int(s) < len(roomStateNames) {
		return roomStateNames[s]
	}
	return fmt.Sprintf("RoomState(%d)", int(s))
}

// holdsAllocation reports whether a room in this state holds a req slot,
// pages and state slots.
func (s RoomState) holdsAllocation() bool {
	return s == RoomAdmitted || s == RoomClaimed || s == RoomResumed || s == RoomRunning || s == RoomDraining
}

package kvmanager

import (
	"time"

	"github.com/decodeplane/decodeplane/prealloc"
)

// Observer receives the manager's events, for metrics. Calls are made with
// the room's (or the shard's) lock held, concurrently from different shards
// (DPRankResolvedN, LookupDPRanks's count, without any lock):
// implementations must be fast, safe for concurrent use, and must not call
// back into the manager.
type Observer interface {
	// RoomPhase is a room moving from one phase to another (from is
	// PhaseUnspecified for a new room; to may be terminal).
	RoomPhase(from, to Phase)
	// RoomForgotten is a terminal room leaving the retained set.
	RoomForgotten(p Phase)
	// RoomFinished is a room reaching Succeeded or Failed: its hand-off
	// outcome and the time from OpenRoom. code is FailureUnspecified on success.
	RoomFinished(outcome Phase, code FailureCode, sinceOpen time.Duration)
	// DestinationLatency is the time from OpenRoom to admission (the
	// destination is ready for prefill).
	DestinationLatency(d time.Duration)
	// TransferLatency is the time from admission to success and the KV
	// bytes the room's chunks landed (0 when none reported bytes).
	TransferLatency(d time.Duration, bytes uint64)
	// ChunkDone is one chunk that landed (ok) or failed; d < 0 means the
	// duration is unknown (the prefill moved the chunk itself).
	ChunkDone(bytes int64, d time.Duration, ok bool)
	// DPRankResolved counts resolutions by rule.
	DPRankResolved(rule DPRule)
	// DPRankResolvedN counts n resolutions by one rule (one LookupDPRanks call).
	DPRankResolvedN(rule DPRule, n int)
	// AdmissionPass is one admission pass on a shard.
	AdmissionPass(shard, admitted int, blocked prealloc.BlockReason)
	// PrefillRegistered counts rank registrations (replaced: a new endpoint
	// or instance for a known rank).
	PrefillRegistered(addr string, replaced bool)
	// PrefillLost is an instance declared dead (heartbeats stopped).
	PrefillLost(addr string, rooms int)
	// HeartbeatMissed is a rank whose heartbeat is overdue at a check.
	HeartbeatMissed(addr string)
	// PrefillInstanceReplaced is a prefill instance at addr replaced by a
	// new instance_id (its new incarnation) behind the same bootstrap
	// address.
	PrefillInstanceReplaced(addr string)
	// RoomEndAcks counts acknowledgements of ended rooms by outcome:
	// "acked" (one per owing rank) and "expired" (the owed ones given up on
	// when release.deferred_timeout passed).
	RoomEndAcks(outcome string, n int)
	// RoomsAdopted is n rooms adopted by one Resync call.
	RoomsAdopted(n int)
	// ResyncEnded is the end of the engine resync wait: d after it started,
	// rooms adopted, expired when the timeout ended it.
	ResyncEnded(d time.Duration, rooms int, expired bool)
	// DeclarationRefused is a destination the decode engine declared that
	// named something another room's hand-off still held (kv_pool.owner:
	// engine), on a decode DP shard.
	DeclarationRefused(shard int)
	// PageReuseViolations is n pages, metadata rows or state slots handed
	// to a room on a decode DP shard while a writer of the room that held
	// them may still land in them (reach.go): a broken invariant, never 0
	// in a correct daemon.
	PageReuseViolations(shard, n int)
}

// NopObserver ignores every event.
type NopObserver struct{}

func (NopObserver) RoomPhase(from, to Phase)                       {}
func (NopObserver) RoomForgotten(p Phase)                          {}
func (NopObserver) RoomFinished(Phase, FailureCode, time.Duration) {}
func (NopObserver) DestinationLatency(time.Duration)               {}
func (NopObserver) TransferLatency(time.Duration, uint64)          {}
func (NopObserver) ChunkDone(int64, time.Duration, bool)           {}
func (NopObserver) DPRankResolved(DPRule)                          {}
func (NopObserver) DPRankResolvedN(DPRule, int)                    {}
func (NopObserver) AdmissionPass(int, int, prealloc.BlockReason)   {}
func (NopObserver) PrefillRegistered(string, bool)                 {}
func (NopObserver) PrefillLost(string, int)                        {}
func (NopObserver) HeartbeatMissed(string)                         {}
func (NopObserver) PrefillInstanceReplaced(string)                 {}
func (NopObserver) RoomEndAcks(string, int)                        {}
func (NopObserver) RoomsAdopted(int)                               {}
func (NopObserver) ResyncEnded(time.Duration, int, bool)           {}
func (NopObserver) DeclarationRefused(int)                         {}
func (NopObserver) PageReuseViolations(int, int)                   {}

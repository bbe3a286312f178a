package ops

import (
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The domain ↔ wire enum mappings, one table each, indexed by the domain
// value so that a duplicated entry does not compile. A domain value missing
// from a table maps to the wire's UNSPECIFIED (or, for KVPoll, Failed);
// enums_test.go walks every domain and every wire value and proves the
// round trip and that the names agree, so a value added on one side only
// fails the test rather than travelling as the wrong number.

var phaseWire = [...]pb.RoomPhase{
	kvmanager.PhaseUnspecified:    pb.RoomPhase_ROOM_PHASE_UNSPECIFIED,
	kvmanager.PhaseWaitingPrefill: pb.RoomPhase_ROOM_PHASE_WAITING_PREFILL,
	kvmanager.PhaseResolvingDP:    pb.RoomPhase_ROOM_PHASE_RESOLVING_DP_RANK,
	kvmanager.PhaseQueued:         pb.RoomPhase_ROOM_PHASE_QUEUED,
	kvmanager.PhaseAdmitted:       pb.RoomPhase_ROOM_PHASE_ADMITTED,
	kvmanager.PhaseClaimed:        pb.RoomPhase_ROOM_PHASE_CLAIMED,
	kvmanager.PhaseTransferring:   pb.RoomPhase_ROOM_PHASE_TRANSFERRING,
	kvmanager.PhaseSucceeded:      pb.RoomPhase_ROOM_PHASE_SUCCEEDED,
	kvmanager.PhaseReleased:       pb.RoomPhase_ROOM_PHASE_RELEASED,
	kvmanager.PhaseFailed:         pb.RoomPhase_ROOM_PHASE_FAILED,
	kvmanager.PhaseRetracted:      pb.RoomPhase_ROOM_PHASE_RETRACTED,
	kvmanager.PhaseHeld:           pb.RoomPhase_ROOM_PHASE_HELD,
}

var pollWire = [...]pb.KVPoll{
	kvmanager.PollFailed:          pb.KVPoll_KV_POLL_FAILED,
	kvmanager.PollBootstrapping:   pb.KVPoll_KV_POLL_BOOTSTRAPPING,
	kvmanager.PollWaitingForInput: pb.KVPoll_KV_POLL_WAITING_FOR_INPUT,
	kvmanager.PollTransferring:    pb.KVPoll_KV_POLL_TRANSFERRING,
	kvmanager.PollSuccess:         pb.KVPoll_KV_POLL_SUCCESS,
}

var failureWire = [...]pb.FailureCode{
	kvmanager.FailureUnspecified:        pb.FailureCode_FAILURE_CODE_UNSPECIFIED,
	kvmanager.FailureAborted:            pb.FailureCode_FAILURE_CODE_ABORTED,
	kvmanager.FailurePrefillUnavailable: pb.FailureCode_FAILURE_CODE_PREFILL_UNAVAILABLE,
	kvmanager.FailurePrefillLost:        pb.FailureCode_FAILURE_CODE_PREFILL_LOST,
	kvmanager.FailureDPRankUnresolved:   pb.FailureCode_FAILURE_CODE_DP_RANK_UNRESOLVED,
	kvmanager.FailureDPRankConflict:     pb.FailureCode_FAILURE_CODE_DP_RANK_CONFLICT,
	kvmanager.FailureBootstrapTimeout:   pb.FailureCode_FAILURE_CODE_BOOTSTRAP_TIMEOUT,
	kvmanager.FailureClaimTimeout:       pb.FailureCode_FAILURE_CODE_CLAIM_TIMEOUT,
	kvmanager.FailureWaitingTimeout:     pb.FailureCode_FAILURE_CODE_WAITING_TIMEOUT,
	kvmanager.FailureTransferFailed:     pb.FailureCode_FAILURE_CODE_TRANSFER_FAILED,
	kvmanager.FailureMetadataCorruption: pb.FailureCode_FAILURE_CODE_METADATA_CORRUPTION,
	kvmanager.FailureStagingFailed:      pb.FailureCode_FAILURE_CODE_STAGING_FAILED,
	kvmanager.FailureShutdown:           pb.FailureCode_FAILURE_CODE_SHUTDOWN,
	kvmanager.FailureRetractTimeout:     pb.FailureCode_FAILURE_CODE_RETRACT_TIMEOUT,
	kvmanager.FailureDeadlineExceeded:   pb.FailureCode_FAILURE_CODE_DEADLINE_EXCEEDED,
}

var dpRuleWire = [...]pb.DPRankRule{
	kvmanager.DPRuleNone:       pb.DPRankRule_DP_RANK_RULE_UNSPECIFIED,
	kvmanager.DPRuleHint:       pb.DPRankRule_DP_RANK_RULE_HINT,
	kvmanager.DPRuleSingleDP:   pb.DPRankRule_DP_RANK_RULE_SINGLE_DP,
	kvmanager.DPRuleFollowRoom: pb.DPRankRule_DP_RANK_RULE_FOLLOW_ROOM,
	kvmanager.DPRuleBinding:    pb.DPRankRule_DP_RANK_RULE_BINDING,
}

// stateTypeWire has no entry 0: kvlayout's state types start at 1.
var stateTypeWire = [...]pb.StateType{
	0:                   pb.StateType_STATE_TYPE_UNSPECIFIED,
	kvlayout.StateMamba: pb.StateType_STATE_TYPE_MAMBA,
	kvlayout.StateSWA:   pb.StateType_STATE_TYPE_SWA,
	kvlayout.StateDSA:   pb.StateType_STATE_TYPE_DSA,
}

// wireOf looks v up in table; a value outside it maps to the table's entry 0
// (UNSPECIFIED, or KV_POLL_FAILED).
func wireOf[D ~int | ~uint8, W any](table []W, v D) W {
	if v < 0 || int(v) >= len(table) {
		return table[0]
	}
	return table[v]
}

// domainOf is the inverse of a table: the domain value whose wire value is w,
// or false if none has it.
func domainOf[D ~int | ~uint8, W comparable](table []W, w W) (D, bool) {
	for i, x := range table {
		if x == w {
			return D(i), true
		}
	}
	return 0, false
}

func phaseToProto(p kvmanager.Phase) pb.RoomPhase { return wireOf(phaseWire[:], p) }

// phaseFromProto maps a wire phase to the domain's; a value the domain does
// not know is PhaseUnspecified (the validator refuses those before a handler
// runs).
func phaseFromProto(p pb.RoomPhase) kvmanager.Phase {
	d, _ := domainOf[kvmanager.Phase](phaseWire[:], p)
	return d
}

func pollToProto(p kvmanager.KVPoll) pb.KVPoll                  { return wireOf(pollWire[:], p) }
func failureCodeToProto(c kvmanager.FailureCode) pb.FailureCode { return wireOf(failureWire[:], c) }
func dpRuleToProto(r kvmanager.DPRule) pb.DPRankRule            { return wireOf(dpRuleWire[:], r) }
func stateTypeToProto(t kvlayout.StateType) pb.StateType        { return wireOf(stateTypeWire[:], t) }

// stateFromProto maps declared state indices to the domain's (the
// validator refused undefined types before a handler runs).
func stateFromProto(in []*pb.StateIndices) []kvlayout.StateIndices {
	if len(in) == 0 {
		return nil
	}
	out := make([]kvlayout.StateIndices, len(in))
	for i, s := range in {
		t, _ := domainOf[kvlayout.StateType](stateTypeWire[:], s.GetType())
		out[i] = kvlayout.StateIndices{Type: t, Indices: s.GetIndices()}
	}
	return out
}

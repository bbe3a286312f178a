package ops

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// LayoutProto is the wire form of a decode KV layout (as GetStatus reports
// it).
func LayoutProto(l kvlayout.Layout) *pb.KVLayout { return layoutToProto(l) }

// FingerprintProto is the wire form of a decode pool's fingerprint, with
// its digest.
func FingerprintProto(f kvlayout.Fingerprint) *pb.Fingerprint {
	return &pb.Fingerprint{
		PageSize: uint32(f.PageSize), KvCacheDtype: f.DType, KvPoolKind: f.Kind.String(), NumLayers: uint32(f.NumLayers),
		TotalKvHeads: uint32(f.TotalKVHeads), HeadDim: uint32(f.HeadDim), KvLoraRank: uint32(f.KVLoraRank), QkRopeHeadDim: uint32(f.QKRopeHeadDim),
		PageOwner: f.Owner.String(), ModelName: f.ModelName, ModelRevision: f.ModelRevision, Digest: f.Digest(),
	}
}

func layoutToProto(l kvlayout.Layout) *pb.KVLayout {
	out := &pb.KVLayout{
		Kind:           l.Kind.String(),
		PageOwner:      l.Owner.String(),
		IsMla:          l.IsMLA,
		NumLayers:      uint32(l.NumLayers),
		TotalKvHeads:   uint32(l.TotalKVHeads),
		HeadsPerRank:   uint32(l.HeadsPerRank),
		HeadDim:        uint32(l.HeadDim),
		KvCacheDtype:   l.DType,
		DtypeBytes:     uint32(l.DTypeBytes),
		PageSize:       uint32(l.PageSize),
		AttnTpSize:     uint32(l.AttnTP),
		DpSize:         uint32(l.DP),
		PpSize:         uint32(l.PP),
		DcpSize:        uint32(l.DCP),
		StagingEnabled: l.Staging,
		TokenBytes:     uint64(l.TokenBytes()),
		ItemLen:        uint64(l.ItemLen()),
		TotalPages:     uint64(l.TotalPages),
	}
	for _, st := range l.StateTypes {
		out.StateTypes = append(out.StateTypes, stateTypeToProto(st))
	}
	return out
}

func rankToProto(r kvmanager.RankID) *pb.PrefillRank {
	return &pb.PrefillRank{BootstrapAddr: r.Addr, DpRank: uint32(r.DP), CpRank: uint32(r.CP), TpRank: uint32(r.TP), PpRank: uint32(r.PP)}
}

// clampU32 is n on the wire: a rank count beyond uint32 (possible only if
// the wire bounds let such sizes through) shows as the maximum, not wrapped.
func clampU32(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }

func rankFromProto(r *pb.PrefillRank) kvmanager.RankID {
	return kvmanager.RankID{Addr: r.GetBootstrapAddr(), DP: int(r.GetDpRank()), CP: int(r.GetCpRank()), TP: int(r.GetTpRank()), PP: int(r.GetPpRank())}
}

func registrationFromProto(req *pb.RegisterPrefillRequest) kvmanager.Registration {
	p := req.GetParallel()
	m := req.GetModel()
	return kvmanager.Registration{
		Addr:       req.GetBootstrapAddr(),
		Endpoint:   req.GetRankEndpoint(),
		InstanceID: req.GetInstanceId(),
		Parallel: kvmanager.ParallelInfo{
			AttnTP: int(p.GetAttnTpSize()), AttnTPRank: int(p.GetAttnTpRank()),
			AttnCP: int(p.GetAttnCpSize()), AttnCPRank: int(p.GetAttnCpRank()),
			AttnDP: int(p.GetAttnDpSize()), AttnDPRank: int(p.GetAttnDpRank()),
			PP: int(p.GetPpSize()), PPRank: int(p.GetPpRank()),
			SystemDP: int(p.GetSystemDpSize()), SystemDPRank: int(p.GetSystemDpRank()),
		},
		PageSize:           int(req.GetPageSize()),
		KVDType:            req.GetKvCacheDtype(),
		LoadBalanceMethod:  req.GetLoadBalanceMethod(),
		DSACacheLayerSplit: req.GetEnableDsaCacheLayerSplit(),
		HTTPPort:           int(req.GetPrefillHttpPort()),
		Model: kvmanager.ModelFacts{
			Kind: m.GetKvPoolKind(), NumLayers: int(m.GetNumLayers()), TotalKVHeads: int(m.GetTotalKvHeads()),
			HeadDim: int(m.GetHeadDim()), KVLoraRank: int(m.GetKvLoraRank()), QKRopeHeadDim: int(m.GetQkRopeHeadDim()),
			ModelName: m.GetModelName(), ModelRevision: m.GetModelRevision(),
		},
	}
}

func u32s(in []int) []uint32 {
	out := make([]uint32, len(in))
	for i, v := range in {
		out[i] = uint32(v)
	}
	return out
}

func registrationToProto(res kvmanager.RegistrationResult, l kvlayout.Layout) *pb.RegisterPrefillResponse {
	out := &pb.RegisterPrefillResponse{
		DecodeLayout: layoutToProto(l),
		Mapping: &pb.PrefillRankMapping{
			ServesDecodeTpRanks: u32s(res.ServesDecodeTP),
			Dummy:               res.Dummy,
			RequiredDstInfoNum:  uint32(res.RequiredDstInfoNum),
			StagingRequired:     res.Staging,
		},
		HeartbeatInterval:    durationpb.New(res.HeartbeatInterval),
		HeartbeatMaxFailures: uint32(res.MaxFailures),
		RegisteredRanks:      uint32(res.Registered),
		ExpectedRanks:        clampU32(res.Expected),
		Replaced:             res.Replaced,
		RoomsFailed:          uint32(res.RoomsFailed),
	}
	for _, m := range res.Mapping {
		out.Mapping.DecodeRanks = append(out.Mapping.DecodeRanks, &pb.DecodeRankMapping{
			DecodeTpRank:               uint32(m.DecodeTP),
			TargetTpRanks:              u32s(m.TargetTPRanks),
			TargetTpRank:               uint32(m.TargetTPRank),
			TargetCpRanks:              u32s(m.TargetCPRanks),
			TargetPpRanks:              u32s(m.TargetPPRanks),
			RequiredDstInfoNum:         uint32(m.RequiredDstInfoNum),
			RequiredPrefillResponseNum: uint32(m.RequiredPrefillResponseNum),
			DummyTpRanks:               u32s(m.DummyTPRanks),
		})
	}
	return out
}

func openFromProto(req *pb.OpenRoomRequest) kvmanager.OpenRequest {
	o := kvmanager.OpenRequest{
		RID: req.GetRid(), Addr: req.GetBootstrapAddr(), Room: req.GetRoom(), PrefillDP: -1, DecodeDP: -1,
		PromptLen: int(req.GetPromptLen()), OutputLen: int(req.GetOutputLen()), MaxNewTokens: int(req.GetMaxNewTokens()),
		Priority: int(req.GetPriority()), Rebootstrap: req.GetRebootstrap(), IdempotencyKey: req.GetIdempotencyKey(),
	}
	if req.PrefillDpRank != nil {
		o.PrefillDP = int(req.GetPrefillDpRank())
	}
	if req.DecodeDpRank != nil {
		o.DecodeDP = int(req.GetDecodeDpRank())
	}
	o.Timeout, _ = pb.RoomTimeout(req.GetTimeout()) // validated before
	return o
}

func failureToProto(f *kvmanager.Failure) *pb.Failure {
	if f == nil {
		return nil
	}
	return &pb.Failure{Code: failureCodeToProto(f.Code), Message: f.Message, FromAnotherRank: f.FromAnotherRank}
}

func transitionToProto(t kvmanager.Transition) *pb.Transition {
	b := &transitionBlock{}
	b.fill(t)
	return &b.tr
}

// The conversions of the hot path build each answer in one allocation: a
// block holds the message and the messages it points to (timestamps, a
// oneof's wrapper), instead of one allocation each.

// transitionBlock is a Transition and its timestamp.
type transitionBlock struct {
	tr pb.Transition
	at timestamppb.Timestamp
}

func (b *transitionBlock) fill(t kvmanager.Transition) {
	setTimestamp(&b.at, t.At)
	b.tr = pb.Transition{Phase: phaseToProto(t.Phase), Poll: pollToProto(t.Poll), At: &b.at, Sglang: t.SGLang, Note: t.Note, Attempt: t.Attempt}
}

// setTimestamp is timestamppb.New(t) into ts.
func setTimestamp(ts *timestamppb.Timestamp, t time.Time) {
	ts.Seconds, ts.Nanos = t.Unix(), int32(t.Nanosecond())
}

// roomBlock is a Room, its timestamps, its prefill DP rank and its
// request's timeout.
type roomBlock struct {
	room                      pb.Room
	opened, updated, deadline timestamppb.Timestamp
	timeout                   durationpb.Duration
	prefillDP                 uint32
}

func roomToProto(s kvmanager.RoomSnapshot) *pb.Room {
	b := &roomBlock{}
	b.fill(s)
	return &b.room
}

func (b *roomBlock) fill(s kvmanager.RoomSnapshot) {
	setTimestamp(&b.opened, s.OpenedAt)
	setTimestamp(&b.updated, s.UpdatedAt)
	b.room = pb.Room{
		Room: s.Room, Rid: s.RID, BootstrapAddr: s.Addr, DecodeDpRank: uint32(s.DecodeDP),
		DpRankRule: dpRuleToProto(s.DPRule), Poll: pollToProto(s.Poll), Phase: phaseToProto(s.Phase),
		Failure: failureToProto(s.Failure), PromptLen: uint32(s.PromptLen), MaxNewTokens: uint32(s.MaxNewTokens),
		Priority: int32(s.Priority), NumPages: uint32(s.NumPages), MetadataSlot: s.MetadataSlot,
		BytesTransferred: s.BytesTransferred, ChunksDone: uint32(s.ChunksDone),
		OpenedAt: &b.opened, UpdatedAt: &b.updated,
		Attempt: s.Attempt, PageIndices: s.Pages, TraceId: s.TraceID, Staging: s.Staging,
		WaitingFor: s.WaitingFor,
	}
	out := &b.room
	if len(s.Coverage) > 0 {
		cov := make([]pb.RankCoverage, len(s.Coverage))
		out.Coverage = make([]*pb.RankCoverage, len(s.Coverage))
		for i, c := range s.Coverage {
			cov[i] = pb.RankCoverage{CpRank: uint32(c.CP), TpRank: uint32(c.TP), PpRank: uint32(c.PP),
				Claimed: c.Claimed, PagesLanded: uint32(c.PagesLanded), PagesRequired: uint32(c.PagesRequired), LastLanded: c.LastLanded, Bytes: c.Bytes}
			out.Coverage[i] = &cov[i]
		}
	}
	if s.PrefillDP >= 0 {
		b.prefillDP = uint32(s.PrefillDP)
		out.PrefillDpRank = &b.prefillDP
	}
	if s.Timeout > 0 {
		b.timeout.Seconds, b.timeout.Nanos = int64(s.Timeout/time.Second), int32(s.Timeout%time.Second)
		setTimestamp(&b.deadline, s.Deadline)
		out.Timeout, out.Deadline = &b.timeout, &b.deadline
	}
	if len(s.PhaseTimes) > 0 {
		out.PhaseTimes = make([]*pb.PhaseTime, len(s.PhaseTimes))
		for i, pt := range s.PhaseTimes {
			out.PhaseTimes[i] = &pb.PhaseTime{Phase: phaseToProto(pt.Phase), Spent: durationpb.New(pt.Spent)}
		}
	}
	if len(s.Transitions) > 0 {
		ts := make([]transitionBlock, len(s.Transitions))
		out.Transitions = make([]*pb.Transition, len(s.Transitions))
		for i, t := range s.Transitions {
			ts[i].fill(t)
			out.Transitions[i] = &ts[i].tr
		}
	}
}

// roomEventBlock is a WatchRoom event: the event, its room and its
// transition.
type roomEventBlock struct {
	ev   pb.RoomEvent
	room roomBlock
	tr   transitionBlock
}

func roomEventToProto(ev kvmanager.RoomEvent, incarnation uint64) *pb.RoomEvent {
	b := &roomEventBlock{}
	b.room.fill(ev.Room)
	b.tr.fill(ev.Transition)
	b.ev = pb.RoomEvent{Room: &b.room.room, Transition: &b.tr.tr, Terminal: ev.Terminal, Incarnation: incarnation, PagesReusable: ev.PagesReusable}
	return &b.ev
}

func stateToProto(in []kvlayout.StateIndices) []*pb.StateIndices {
	out := make([]*pb.StateIndices, len(in))
	for i, s := range in {
		out[i] = &pb.StateIndices{Type: stateTypeToProto(s.Type), Indices: s.Indices}
	}
	return out
}

// destinationBlock is a Destination event: the event, its oneof wrapper
// and the destination.
type destinationBlock struct {
	ev   pb.DestinationEvent
	wrap pb.DestinationEvent_Destination
	d    pb.Destination
}

// doneBlock is a Done event.
type doneBlock struct {
	ev   pb.DestinationEvent
	wrap pb.DestinationEvent_Done
	done pb.RoomDone
}

func destinationEventToProto(ev kvmanager.DestinationEvent, incarnation uint64) *pb.DestinationEvent {
	switch {
	case ev.Destination != nil:
		d := ev.Destination
		b := &destinationBlock{}
		b.d = pb.Destination{
			Room: d.Room, DecodeDpRank: uint32(d.DecodeDP), PageIndices: d.Pages, PageSize: uint32(d.PageSize),
			FillLen: uint32(d.FillLen), MetadataSlot: d.MetadataSlot, StateIndices: stateToProto(d.State),
			RequiredDstInfoNum: uint32(d.RequiredDstInfoNum), DecodePrefixLen: uint32(d.DecodePrefixLen),
			Dummy: d.Dummy, Staging: d.Staging, Attempt: d.Attempt,
			TokenBytes: uint64(max(d.TokenBytes, 0)), StateBytes: uint64(max(d.StateBytes, 0)),
			PageBytes: uint64(max(d.PageBytes, 0)), AuxBytes: uint64(max(d.AuxBytes, 0)),
			Incarnation: incarnation,
		}
		if len(d.Targets) > 0 {
			ts := make([]pb.DecodeTarget, len(d.Targets))
			b.d.Targets = make([]*pb.DecodeTarget, len(d.Targets))
			for i, t := range d.Targets {
				ts[i] = pb.DecodeTarget{DecodeTpRank: uint32(t.DecodeTP), Dummy: t.Dummy,
					SrcHeadStart: uint32(t.SrcHeadStart), DstHeadStart: uint32(t.DstHeadStart), NumHeads: uint32(t.NumHeads),
					LayoutId: layoutID(d.Layouts, t.DecodeTP)}
				b.d.Targets[i] = &ts[i]
			}
		}
		b.wrap.Destination = &b.d
		b.ev.Event = &b.wrap
		return &b.ev
	case ev.Failure != nil:
		return &pb.DestinationEvent{Event: &pb.DestinationEvent_Failure{Failure: failureToProto(ev.Failure)}, AckRequired: ev.AckRequired}
	default:
		p := kvmanager.PhaseSucceeded
		if ev.Done != nil {
			p = *ev.Done
		}
		b := &doneBlock{}
		b.done.Poll, b.done.Phase = pollToProto(p.Poll()), phaseToProto(p)
		b.wrap.Done = &b.done
		b.ev.Event = &b.wrap
		return &b.ev
	}
}

func chunkFromTransfer(req *pb.TransferRequest) kvmanager.ChunkRequest {
	return kvmanager.ChunkRequest{
		Room: req.GetRoom(), Rank: rankFromProto(req.GetRank()), Index: int(req.GetChunkIndex()),
		PageOffset: int(req.GetPageOffset()), NumPages: int(req.GetNumPages()), Last: req.GetLast(),
		SrcBuffer: req.GetSource().GetBuffer(), SrcPages: req.GetSource().GetPageIndices(),
		SrcAuxRow: sourceAuxRow(req.GetSource()), SrcState: stateFromProto(req.GetSource().GetState()),
		Marker: req.GetAux().GetRoomMarker(), OutputIDs: req.GetAux().GetOutputIds(), Attempt: req.GetAttempt(),
	}
}

func chunkFromReport(req *pb.ReportTransferRequest) kvmanager.ChunkRequest {
	return kvmanager.ChunkRequest{
		Room: req.GetRoom(), Rank: rankFromProto(req.GetRank()), Index: int(req.GetChunkIndex()),
		PageOffset: int(req.GetPageOffset()), NumPages: int(req.GetNumPages()), Last: req.GetLast(),
		Failed: !req.GetSuccess(), Reason: req.GetFailureReason(), Bytes: int64(req.GetBytes()),
		Marker: req.GetMetadataRoomMarker(), Attempt: req.GetAttempt(), SrcAuxRow: -1,
	}
}

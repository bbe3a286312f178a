package ops

import (
	"context"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/transfer"
)

// The room manager (*kvmanager.Manager) as each group of ops sees it: each
// group holds only the methods it calls.

// Manager is every method the table calls.
type Manager interface {
	EngineRooms
	RoomReader
	PrefillRooms
	Bootstrapper
	Stager
	StatusReader
	prefillRegistry
}

// EngineRooms is what the decode engine's room ops call.
type EngineRooms interface {
	OpenRoom(ctx context.Context, req kvmanager.OpenRequest) (kvmanager.RoomSnapshot, bool, error)
	ReleaseRoom(id uint64) (pages int, already bool, err error)
	AbortRoom(id uint64, reason string) (kvmanager.RoomSnapshot, bool, error)
	RetractRoom(id uint64, mode kvmanager.RetractMode) (kvmanager.RoomSnapshot, error)
	ReportRunning(usage []kvmanager.Usage) (grown []kvmanager.Grown, noCapacity, notRunning []uint64, err error)
	ContinueGenerationResumed(ctx context.Context) []kvmanager.Resumed
	Resync(rooms []kvmanager.ResyncRoom, done bool) (int, kvmanager.ResyncState, error)
	DeclareDestination(d kvmanager.Declaration) (kvmanager.RoomSnapshot, bool, error)
	ReportCapacity(shard int, c kvmanager.EngineCapacity) error
	RegisterEngineLayout(ctx context.Context, dp, tp int, l *kvlayout.BufferLayout) (bool, error)
}

// RoomReader is what the reads and watches of rooms call.
type RoomReader interface {
	GetRoom(id uint64, withPages bool) (kvmanager.RoomSnapshot, error)
	ListRooms(f kvmanager.ListFilter) ([]kvmanager.RoomSnapshot, int)
	Watch(id uint64, history bool) (*kvmanager.Watcher, error)
	WatchOutcome(id uint64) (*kvmanager.Watcher, error)
	WatchFunc(id uint64, history, outcome bool, sink kvmanager.WatchSink) (*kvmanager.Watcher, error)
}

// PrefillRooms is what a prefill rank's room ops call.
type PrefillRooms interface {
	AwaitDestination(id uint64, rank kvmanager.RankID) (*kvmanager.Claim, error)
	AwaitDestinationFunc(id uint64, rank kvmanager.RankID, sink kvmanager.ClaimSink) (*kvmanager.Claim, error)
	OfferRooms(rank kvmanager.RankID, sink kvmanager.OfferSink) (stop func())
	Transfer(ctx context.Context, req kvmanager.ChunkRequest) (transfer.ChunkResult, bool, error)
	TransferAsync(ctx context.Context, req kvmanager.ChunkRequest, done func(transfer.ChunkResult, bool, error))
	Poll(id uint64) kvmanager.KVPoll
	ReportTransfer(req kvmanager.ChunkRequest) (kvmanager.KVPoll, bool, error)
	AckRoomEnd(id uint64, rank kvmanager.RankID, attempt uint32) (kvmanager.AckResult, error)
}

// Bootstrapper is what Bootstrap's ops call besides the Registrar.
type Bootstrapper interface {
	Layout() kvlayout.Layout
	BindRoom(addr string, id uint64, dp int) (replaced bool, err error)
	LookupDPRanks(addr string, rooms []uint64, hints map[uint64]int) ([]kvmanager.DPResolution, []uint64, error)
}

// Stager is what Staging's ops call.
type Stager interface {
	SetupStaging(rank kvmanager.RankID) (kvmanager.StagingPlan, error)
	AllocateStaging(id uint64, rank kvmanager.RankID, chunk, numPages int) ([]kvmanager.StagingRegion, error)
	StagingChunkReady(ctx context.Context, req kvmanager.ChunkRequest) (kvmanager.StagingChunkResult, error)
	WatchWatermark(dp int, tps []int) (*kvmanager.WatermarkWatch, error)
}

// StatusReader is what Admin, Capacity and Fleet read.
type StatusReader interface {
	Status() kvmanager.Status
	Capacity() []kvmanager.ShardCapacity
	InFlight() int
	ResyncStatus() kvmanager.ResyncState
	EngineLayouts() []kvmanager.RegisteredLayout
}

// Registrar records prefill registrations and heartbeats: the Manager
// itself with the memory registry, the fleet's shared registry with etcd.
// Its errors are the domain's (Table.Status maps them;
// kvmanager.ErrRegistryUnavailable is UNAVAILABLE with a retry hint).
type Registrar interface {
	RegisterPrefill(ctx context.Context, reg kvmanager.Registration) (kvmanager.RegistrationResult, error)
	Heartbeat(ctx context.Context, rank kvmanager.RankID, instanceID string) (time.Duration, int, error)
	// Touch counts as a heartbeat of every rank of the instance at addr
	// (the HTTP bootstrap's health poll of an SGLang prefill); false when
	// it is not registered or was replaced.
	Touch(ctx context.Context, addr, instanceID string) bool
	// DeregisterPrefill removes the instance at addr (any instance when
	// instanceID is "", else only that one) and fails its rooms still
	// handing off with FailurePrefillLost and reason; removed is false
	// when there was nothing to remove.
	DeregisterPrefill(ctx context.Context, addr, instanceID, reason string) (removed bool, roomsFailed int, err error)
}

// prefillRegistry is the memory registry's calls.
type prefillRegistry interface {
	RegisterPrefill(reg kvmanager.Registration) (kvmanager.RegistrationResult, error)
	Heartbeat(rank kvmanager.RankID, instanceID string) (time.Duration, int, error)
	TouchPrefill(addr, instanceID string) bool
	DeregisterPrefill(addr, instanceID, reason string) (removed bool, roomsFailed int)
}

// managerRegistrar is the memory registry: the Manager's own calls.
type managerRegistrar struct{ m prefillRegistry }

func (r managerRegistrar) RegisterPrefill(_ context.Context, reg kvmanager.Registration) (kvmanager.RegistrationResult, error) {
	return r.m.RegisterPrefill(reg)
}

func (r managerRegistrar) Heartbeat(_ context.Context, rank kvmanager.RankID, instanceID string) (time.Duration, int, error) {
	return r.m.Heartbeat(rank, instanceID)
}

func (r managerRegistrar) Touch(_ context.Context, addr, instanceID string) bool {
	return r.m.TouchPrefill(addr, instanceID)
}

func (r managerRegistrar) DeregisterPrefill(_ context.Context, addr, instanceID, reason string) (bool, int, error) {
	removed, failed := r.m.DeregisterPrefill(addr, instanceID, reason)
	return removed, failed, nil
}

// Registrar is the table's registrar (Config.Registrar, else the
// Manager's).
func (t *Table) Registrar() Registrar { return t.boot.reg }

var _ Manager = (*kvmanager.Manager)(nil)

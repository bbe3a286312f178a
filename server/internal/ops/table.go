package ops

import (
	"context"
	"log/slog"
	"time"

	"github.com/decodeplane/decodeplane/internal/stormlog"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Config is what the table is built from (server.New makes it from its
// Deps).
type Config struct {
	// Logger receives unexpected errors, failed calls and panics.
	Logger *slog.Logger
	// Incarnation is the daemon's (0: nothing is checked).
	Incarnation uint64
	// Token is the bootstrap token ("" needs none).
	Token string
	// Stale counts the stale-incarnation refusals; nil counts nothing.
	Stale StaleMetrics
	// Manager is the room manager; nil serves Admin, Capacity and Fleet
	// only (tests of the gRPC layer alone).
	Manager Manager
	// Registrar records registrations and heartbeats; nil is the Manager's.
	Registrar Registrar
	// Fleet is the shared registry's view; nil is the memory registry.
	Fleet FleetView
	// Host is the server the table runs in.
	Host Host
	// Version, Entries, Layout and TransferPath are reported by GetStatus
	// and GetFleet; Started is when the server was built.
	Version      string
	Entries      []ConfigEntry
	Layout       kvlayout.Layout
	TransferPath string
	Started      time.Time
}

// ConfigEntry is one effective configuration value for Admin.GetStatus.
type ConfigEntry struct {
	Key, Value, Source string
}

// Host is the server the table runs in: its lifecycle, as Admin, Capacity
// and Fleet report it.
type Host interface {
	// Readiness is the readiness, its reason, and whether the server drains.
	Readiness() (ready bool, readiness string, draining bool)
	// Drain starts draining (Admin.Drain).
	Drain()
	// Address is the address the daemon goes by in its fleet.
	Address() string
	// Stopping is done once Shutdown stops serving: the streams with no
	// natural end return.
	Stopping() context.Context
}

// Table is decodeplane.v1's operation table: every operation defined once
// — its request's checks, auth class, span name and metrics label (its
// method), the domain call and the mapping of its answer and errors —
// under every transport: the gRPC services (grpc.go), the sessions'
// ops (package session), the JSON gateway (package gateway) and SGLang's
// HTTP routes (package httpboot).
type Table struct {
	cfg Config
	log *slog.Logger
	// storm logs what every transport may report many times at once (failed
	// calls, unexpected errors, panics: log.go): one line per cause per
	// interval.
	storm *stormlog.Logger
	// fp is the layout's fingerprint (Config.Layout), as every capacity
	// update and the memory registry's GetFleet carry it (cloned).
	fp    *pb.Fingerprint
	reads map[string]bool // the ops that need no token

	engine   engineRooms
	reader   roomReader
	prefill  prefillRooms
	boot     bootstrap
	staging  staging
	stat     statusReader
	services []*serviceOps

	// Rooms, the decode engine's side.
	OpenRoom           Unary[pb.OpenRoomRequest, pb.OpenRoomResponse]
	ReleaseRoom        Unary[pb.ReleaseRoomRequest, pb.ReleaseRoomResponse]
	AbortRoom          Unary[pb.AbortRoomRequest, pb.AbortRoomResponse]
	RetractRoom        Unary[pb.RetractRoomRequest, pb.RetractRoomResponse]
	ReportRunning      Unary[pb.ReportRunningRequest, pb.ReportRunningResponse]
	ContinueGeneration Unary[pb.ContinueGenerationRequest, pb.ContinueGenerationResponse]
	Resync             Unary[pb.ResyncRequest, pb.ResyncResponse]
	DeclareDestination Unary[pb.DeclareDestinationRequest, pb.DeclareDestinationResponse]
	// RegisterEngineLayout registers a decode rank's buffer layout.
	RegisterEngineLayout Unary[pb.RegisterEngineLayoutRequest, pb.RegisterEngineLayoutResponse]
	GetRoom              Unary[pb.GetRoomRequest, pb.Room]
	ListRooms            Unary[pb.ListRoomsRequest, pb.ListRoomsResponse]
	WatchRoom            Stream[pb.WatchRoomRequest, pb.RoomEvent]
	// Rooms, the prefill's side.
	AwaitDestination Stream[pb.AwaitDestinationRequest, pb.DestinationEvent]
	Transfer         Unary[pb.TransferRequest, pb.TransferResponse]
	ReportTransfer   Unary[pb.ReportTransferRequest, pb.ReportTransferResponse]
	AckRoomEnd       Unary[pb.AckRoomEndRequest, pb.AckRoomEndResponse]
	// Bootstrap.
	RegisterPrefill Unary[pb.RegisterPrefillRequest, pb.RegisterPrefillResponse]
	Heartbeat       Unary[pb.HeartbeatRequest, pb.HeartbeatResponse]
	// DeregisterPrefill removes an instance that stops cleanly.
	DeregisterPrefill Unary[pb.DeregisterPrefillRequest, pb.DeregisterPrefillResponse]
	BindRoom          Unary[pb.BindRoomRequest, pb.BindRoomResponse]
	LookupDPRanks     Unary[pb.LookupDPRanksRequest, pb.LookupDPRanksResponse]
	// Staging.
	SetupStaging    Unary[pb.SetupStagingRequest, pb.SetupStagingResponse]
	AllocateStaging Unary[pb.AllocateStagingRequest, pb.AllocateStagingResponse]
	ChunkReady      Unary[pb.ChunkReadyRequest, pb.ChunkReadyResponse]
	WatchWatermark  Stream[pb.WatchWatermarkRequest, pb.Watermark]
	// Admin, Capacity, Fleet.
	GetStatus      Unary[pb.GetStatusRequest, pb.GetStatusResponse]
	Drain          Unary[pb.DrainRequest, pb.DrainResponse]
	WatchCapacity  Stream[pb.WatchCapacityRequest, pb.CapacityUpdate]
	ReportCapacity Unary[pb.ReportCapacityRequest, pb.ReportCapacityResponse]
	GetFleet       Unary[pb.GetFleetRequest, pb.GetFleetResponse]
	// The sessions, whose ops are the ones above.
	EngineSession  Session
	PrefillSession Session
}

// The auth classes of unary and stream ops.
const (
	readOnly = true  // a read: no token
	mutating = false // needs the token
)

// New builds the table.
func New(cfg Config) *Table {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &Table{cfg: cfg, log: cfg.Logger, storm: stormlog.New(cfg.Logger, stormlog.Options{}), reads: map[string]bool{}, fp: FingerprintProto(cfg.Layout.Fingerprint())}
	if m := cfg.Manager; m != nil {
		reg := cfg.Registrar
		if reg == nil {
			reg = managerRegistrar{m}
		}
		t.engine, t.reader, t.prefill = engineRooms{t, m}, roomReader{t, m}, prefillRooms{t, m}
		t.boot, t.staging, t.stat = bootstrap{t, m, reg}, staging{t, m}, statusReader{t, m}
	}
	t.define()
	t.services = t.serviceOps()
	return t
}

// define defines every op: its method, its auth class and its call.
func (t *Table) define() {
	e, r, p, b, s := &t.engine, &t.reader, &t.prefill, &t.boot, &t.staging
	t.OpenRoom = unary(t, pb.Rooms_OpenRoom_FullMethodName, mutating, e.openRoom)
	t.ReleaseRoom = unary(t, pb.Rooms_ReleaseRoom_FullMethodName, mutating, e.releaseRoom)
	t.AbortRoom = unary(t, pb.Rooms_AbortRoom_FullMethodName, mutating, e.abortRoom)
	t.RetractRoom = unary(t, pb.Rooms_RetractRoom_FullMethodName, mutating, e.retractRoom)
	t.ReportRunning = unary(t, pb.Rooms_ReportRunning_FullMethodName, mutating, e.reportRunning)
	t.ContinueGeneration = unary(t, pb.Rooms_ContinueGeneration_FullMethodName, mutating, e.continueGeneration)
	t.Resync = unary(t, pb.Rooms_Resync_FullMethodName, mutating, e.resync)
	t.DeclareDestination = unary(t, pb.Rooms_DeclareDestination_FullMethodName, mutating, e.declareDestination)
	t.RegisterEngineLayout = unary(t, pb.Rooms_RegisterEngineLayout_FullMethodName, mutating, e.registerEngineLayout)
	t.GetRoom = unary(t, pb.Rooms_GetRoom_FullMethodName, readOnly, r.getRoom)
	t.ListRooms = unary(t, pb.Rooms_ListRooms_FullMethodName, readOnly, r.listRooms)
	t.WatchRoom = stream(t, pb.Rooms_WatchRoom_FullMethodName, readOnly, r.watchRoom)

	t.AwaitDestination = stream(t, pb.Rooms_AwaitDestination_FullMethodName, mutating, p.awaitDestination)
	t.Transfer = unary(t, pb.Rooms_Transfer_FullMethodName, mutating, p.transfer)
	t.ReportTransfer = unary(t, pb.Rooms_ReportTransfer_FullMethodName, mutating, p.reportTransfer)
	t.AckRoomEnd = unary(t, pb.Rooms_AckRoomEnd_FullMethodName, mutating, p.ackRoomEnd)

	t.RegisterPrefill = unary(t, pb.Bootstrap_RegisterPrefill_FullMethodName, mutating, b.registerPrefill)
	t.Heartbeat = unary(t, pb.Bootstrap_Heartbeat_FullMethodName, mutating, b.heartbeat)
	t.DeregisterPrefill = unary(t, pb.Bootstrap_DeregisterPrefill_FullMethodName, mutating, b.deregisterPrefill)
	t.BindRoom = unary(t, pb.Bootstrap_BindRoom_FullMethodName, mutating, b.bindRoom)
	t.LookupDPRanks = unary(t, pb.Bootstrap_LookupDPRanks_FullMethodName, readOnly, b.lookupDPRanks)

	t.SetupStaging = unary(t, pb.Staging_SetupStaging_FullMethodName, readOnly, s.setupStaging) // the plan only: nothing is allocated
	t.AllocateStaging = unary(t, pb.Staging_AllocateStaging_FullMethodName, mutating, s.allocateStaging)
	t.ChunkReady = unary(t, pb.Staging_ChunkReady_FullMethodName, mutating, s.chunkReady)
	t.WatchWatermark = stream(t, pb.Staging_WatchWatermark_FullMethodName, readOnly, s.watchWatermark)

	t.GetStatus = unary(t, pb.Admin_GetStatus_FullMethodName, readOnly, t.getStatus)
	t.Drain = unary(t, pb.Admin_Drain_FullMethodName, mutating, t.drain)
	// capacity.proto: UNAUTHENTICATED when a token is configured.
	t.WatchCapacity = stream(t, pb.Capacity_WatchCapacity_FullMethodName, mutating, t.watchCapacity)
	t.ReportCapacity = unary(t, pb.Capacity_ReportCapacity_FullMethodName, mutating, e.reportCapacity)
	// A read that needs the token all the same (fleet.proto): it lists the
	// fleet's daemons and prefill instances.
	t.GetFleet = unary(t, pb.Fleet_GetFleet_FullMethodName, mutating, t.getFleet)

	// The sessions need the token whatever their ops.
	t.EngineSession = Session{op{t: t, method: pb.EngineSession_Session_FullMethodName}}
	t.PrefillSession = Session{op{t: t, method: pb.PrefillSession_Session_FullMethodName}}
}

func unary[Req, Resp any](t *Table, method string, read bool, call func(context.Context, *Req) (*Resp, error)) Unary[Req, Resp] {
	if read {
		t.reads[method] = true
	}
	return Unary[Req, Resp]{op: op{t: t, method: method, read: read}, call: call}
}

func stream[Req, Resp any](t *Table, method string, read bool, call func(context.Context, *Req, func(*Resp) error) error) Stream[Req, Resp] {
	if read {
		t.reads[method] = true
	}
	return Stream[Req, Resp]{op: op{t: t, method: method, read: read}, call: call}
}

// Log is the table's logger.
func (t *Table) Log() *slog.Logger { return t.log }

// Close writes the summaries of what the table logged that are still
// pending (the server stops).
func (t *Table) Close() { t.storm.Close() }

// HasManager reports whether the table has a room manager (and serves
// Bootstrap, Rooms, Staging and the sessions).
func (t *Table) HasManager() bool { return t.cfg.Manager != nil }

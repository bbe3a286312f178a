package client

import (
	"context"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Admin is the operator's view of a daemon (Client.Admin): its status and
// draining (the Admin service), reading its rooms (GetRoom, ListRooms), its
// fleet (the Fleet service) and its capacity (the Capacity service, which a
// router follows to pick a decode instance). It holds no connection of its
// own: every call goes through its Client, whose retry policy, token and
// Close apply.
//
// Each method is one RPC: it takes the generated request (so that fields
// added to the API need no new signature), runs the call under the retry
// policy of its row in retryTable, and returns the generated answer or an
// *Error.
type Admin struct {
	c *Client
}

// Status returns the daemon's version, readiness, effective configuration
// and a summary of rooms, shards (the page ledgers) and prefills.
// Retried on Unavailable.
func (a *Admin) Status(ctx context.Context) (*pb.GetStatusResponse, error) {
	return a.c.status(ctx)
}

// status is GetStatus, for the views that ask the daemon's incarnation.
func (c *Client) status(ctx context.Context) (*pb.GetStatusResponse, error) {
	return invoke(ctx, c, pb.Admin_GetStatus_FullMethodName, &pb.GetStatusRequest{}, c.adminSvc.GetStatus)
}

// Drain stops the daemon admitting rooms (OpenRoom then fails with
// ErrUnavailable) and flips its health to NOT_SERVING; rooms in flight
// finish. Idempotent on the daemon, but never retried automatically.
// Needs the token when the daemon has one.
func (a *Admin) Drain(ctx context.Context) (*pb.DrainResponse, error) {
	return invoke(ctx, a.c, pb.Admin_Drain_FullMethodName, &pb.DrainRequest{}, a.c.adminSvc.Drain)
}

// GetRoom returns a room's state and timeline (and its pages when
// req.IncludePages is set). ErrNotFound for an unknown room. Retried on
// Unavailable.
func (a *Admin) GetRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	return a.c.getRoom(ctx, req)
}

// getRoom is GetRoom, for the views that read a room's state (a
// hand-off's failure).
func (c *Client) getRoom(ctx context.Context, req *pb.GetRoomRequest) (*pb.Room, error) {
	return invoke(ctx, c, pb.Rooms_GetRoom_FullMethodName, req, c.rooms.GetRoom)
}

// ListRooms lists live and recently finished rooms, filtered by req.
// Retried on Unavailable.
func (a *Admin) ListRooms(ctx context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	return invoke(ctx, a.c, pb.Rooms_ListRooms_FullMethodName, req, a.c.rooms.ListRooms)
}

// GetFleet lists every decode daemon and prefill instance of the daemon's
// registry (with registry.backend etcd, the whole fleet, from the daemon's
// cached view; with the memory registry, the daemon itself and the prefill
// instances registered with it), with incarnation, liveness and capacity:
// what a prefill rank in a fleet builds its clients from
// (RunHeartbeatFailover). Needs the token when the daemon has one. Retried
// on Unavailable.
func (a *Admin) GetFleet(ctx context.Context) (*pb.GetFleetResponse, error) {
	return invoke(ctx, a.c, pb.Fleet_GetFleet_FullMethodName, &pb.GetFleetRequest{}, a.c.fleet.GetFleet)
}

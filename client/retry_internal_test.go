package client

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// wrapped lists the services this package wraps; a new one (Staging) is added
// here with its rows in retryTable.
var wrapped = []grpc.ServiceDesc{pb.Admin_ServiceDesc, pb.Bootstrap_ServiceDesc, pb.Rooms_ServiceDesc, pb.Fleet_ServiceDesc, pb.Capacity_ServiceDesc, pb.EngineSession_ServiceDesc, pb.PrefillSession_ServiceDesc}

// TestRetryTableCoversEveryRPC fails when an RPC is added to a wrapped
// service without a decision on its retries, or when the table names an RPC
// that does not exist.
func TestRetryTableCoversEveryRPC(t *testing.T) {
	methods := map[string]bool{}
	for _, sd := range wrapped {
		for _, m := range sd.Methods {
			methods["/"+sd.ServiceName+"/"+m.MethodName] = true
		}
		for _, s := range sd.Streams {
			methods["/"+sd.ServiceName+"/"+s.StreamName] = true
		}
	}
	for m := range methods {
		if _, ok := retryTable[m]; !ok {
			t.Errorf("%s has no row in retryTable", m)
		}
	}
	for m := range retryTable {
		if !methods[m] {
			t.Errorf("retryTable names %s, which no wrapped service has", m)
		}
	}
}

// TestRetryClasses pins the table to the contract in the proto comments.
func TestRetryClasses(t *testing.T) {
	keyed := &pb.OpenRoomRequest{IdempotencyKey: "k"}
	tests := []struct {
		name   string
		method string
		req    any
		want   bool
	}{
		{"GetStatus", pb.Admin_GetStatus_FullMethodName, &pb.GetStatusRequest{}, true},
		{"Drain", pb.Admin_Drain_FullMethodName, &pb.DrainRequest{}, false},
		{"RegisterPrefill", pb.Bootstrap_RegisterPrefill_FullMethodName, &pb.RegisterPrefillRequest{}, true},
		{"Heartbeat", pb.Bootstrap_Heartbeat_FullMethodName, &pb.HeartbeatRequest{}, true},
		{"BindRoom", pb.Bootstrap_BindRoom_FullMethodName, &pb.BindRoomRequest{}, true},
		{"LookupDPRanks", pb.Bootstrap_LookupDPRanks_FullMethodName, &pb.LookupDPRanksRequest{}, true},
		{"OpenRoom without a key", pb.Rooms_OpenRoom_FullMethodName, &pb.OpenRoomRequest{}, false},
		{"OpenRoom with a key", pb.Rooms_OpenRoom_FullMethodName, keyed, true},
		{"OpenRoom nil", pb.Rooms_OpenRoom_FullMethodName, (*pb.OpenRoomRequest)(nil), false},
		{"AwaitDestination", pb.Rooms_AwaitDestination_FullMethodName, &pb.AwaitDestinationRequest{}, true},
		{"Transfer", pb.Rooms_Transfer_FullMethodName, &pb.TransferRequest{}, true},
		{"ReportTransfer", pb.Rooms_ReportTransfer_FullMethodName, &pb.ReportTransferRequest{}, true},
		{"WatchRoom", pb.Rooms_WatchRoom_FullMethodName, &pb.WatchRoomRequest{}, true},
		{"GetRoom", pb.Rooms_GetRoom_FullMethodName, &pb.GetRoomRequest{}, true},
		{"AbortRoom", pb.Rooms_AbortRoom_FullMethodName, &pb.AbortRoomRequest{}, true},
		{"ReleaseRoom", pb.Rooms_ReleaseRoom_FullMethodName, &pb.ReleaseRoomRequest{}, true},
		{"ListRooms", pb.Rooms_ListRooms_FullMethodName, &pb.ListRoomsRequest{}, true},
		{"ReportRunning", pb.Rooms_ReportRunning_FullMethodName, &pb.ReportRunningRequest{}, false},
		{"RetractRoom", pb.Rooms_RetractRoom_FullMethodName, &pb.RetractRoomRequest{}, false},
		{"ContinueGeneration", pb.Rooms_ContinueGeneration_FullMethodName, &pb.ContinueGenerationRequest{}, false},
		{"GetFleet", pb.Fleet_GetFleet_FullMethodName, &pb.GetFleetRequest{}, true},
		{"EngineSession", pb.EngineSession_Session_FullMethodName, &pb.EngineRequest{}, false},
		{"unknown RPC", "/decodeplane.v1.Staging/Reserve", nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retryable(tt.method, tt.req); got != tt.want {
				t.Errorf("retryable(%s) = %v, want %v", tt.method, got, tt.want)
			}
		})
	}
}

func TestRetryDelay(t *testing.T) {
	p := RetryPolicy{InitialBackoff: 8 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}.withDefaults()
	withRI := func(c codes.Code, d time.Duration) *status.Status {
		st, err := status.New(c, "x").WithDetails(durationRetryInfo(d))
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	tests := []struct {
		name    string
		st      *status.Status
		attempt int
		min     time.Duration
		max     time.Duration
		ok      bool
	}{
		{"Unavailable backs off", status.New(codes.Unavailable, "x"), 1, 4 * time.Millisecond, 8 * time.Millisecond, true},
		{"and doubles", status.New(codes.Unavailable, "x"), 2, 8 * time.Millisecond, 16 * time.Millisecond, true},
		{"up to the cap", status.New(codes.Unavailable, "x"), 9, 10 * time.Millisecond, 20 * time.Millisecond, true},
		{"Unavailable with RetryInfo waits as told", withRI(codes.Unavailable, 3*time.Second), 1, 3 * time.Second, 3 * time.Second, true},
		{"ResourceExhausted with RetryInfo", withRI(codes.ResourceExhausted, 250*time.Millisecond), 1, 250 * time.Millisecond, 250 * time.Millisecond, true},
		{"ResourceExhausted without RetryInfo", status.New(codes.ResourceExhausted, "x"), 1, 0, 0, false},
		{"NotFound", status.New(codes.NotFound, "x"), 1, 0, 0, false},
		{"FailedPrecondition", withRI(codes.FailedPrecondition, time.Second), 1, 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for range 50 { // jitter
				d, ok := p.retryDelay(tt.st, tt.attempt)
				if ok != tt.ok || d < tt.min || d > tt.max {
					t.Fatalf("retryDelay(%s, attempt %d) = %s, %v; want [%s, %s], %v", tt.st.Code(), tt.attempt, d, ok, tt.min, tt.max, tt.ok)
				}
			}
		})
	}
}

func TestRetryPolicyDefaults(t *testing.T) {
	got := RetryPolicy{}.withDefaults()
	if diff := cmp.Diff(DefaultRetryPolicy(), got); diff != "" {
		t.Errorf("zero policy with defaults (-want +got):\n%s", diff)
	}
	if got := (RetryPolicy{InitialBackoff: 3 * time.Second}).withDefaults(); got.MaxBackoff != 3*time.Second {
		t.Errorf("MaxBackoff = %s, want it raised to the initial backoff", got.MaxBackoff)
	}
}

func durationRetryInfo(d time.Duration) *errdetails.RetryInfo {
	return &errdetails.RetryInfo{RetryDelay: durationpb.New(d)}
}

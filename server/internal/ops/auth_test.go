package ops

import "testing"

func TestNeedsToken(t *testing.T) {
	tests := map[string]bool{
		"/decodeplane.v1.Admin/Drain":                                    true,
		"/decodeplane.v1.Admin/GetStatus":                                false,
		"/decodeplane.v1.Fleet/GetFleet":                                 true, // a read, but fleet.proto says UNAUTHENTICATED
		"/decodeplane.v1.Bootstrap/RegisterPrefill":                      true,
		"/decodeplane.v1.Bootstrap/LookupDPRanks":                        false,
		"/decodeplane.v1.Rooms/OpenRoom":                                 true,
		"/decodeplane.v1.Rooms/GetRoom":                                  false,
		"/decodeplane.v1.Rooms/ListRooms":                                false,
		"/decodeplane.v1.Rooms/WatchRoom":                                false,
		"/decodeplane.v1.Capacity/WatchCapacity":                         true, // capacity.proto: UNAUTHENTICATED when a token is configured
		"/decodeplane.v1.EngineSession/Session":                          true, // engine_session.proto: the stream needs it whatever its ops
		"/decodeplane.v1.PrefillSession/Session":                         true, // a prefill rank's claims and chunks
		"/grpc.health.v1.Health/Check":                                   false,
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      false,
		"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": false,
	}
	tb := New(Config{}) // the auth classes are the table's whether it has a manager or not
	for m, want := range tests {
		if got := tb.NeedsToken(m); got != want {
			t.Errorf("NeedsToken(%s) = %v, want %v", m, got, want)
		}
	}
}

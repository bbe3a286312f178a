package decodeplanev1

import (
	"math"
	"testing"
)

// TestAckRoomEndAttemptBound: an acknowledgement's attempt has one bound,
// 1..4294967295 (any generation the daemon can hand out), and both of its
// ends are refused with the same message naming it.
func TestAckRoomEndAttemptBound(t *testing.T) {
	rank := &PrefillRank{BootstrapAddr: "10.0.0.1:8998"}
	const refusal = "attempt: 0 is out of range (allowed 1..4294967295): the destination's attempt (Destination.attempt)"
	for _, tc := range []struct {
		name    string
		attempt uint32
		want    string // "" = valid
	}{
		{"0", 0, refusal},
		{"1", 1, ""},
		{"2^20", 1 << 20, ""},
		{"2^20+1", 1<<20 + 1, ""},
		{"2^31", 1 << 31, ""},
		{"2^32-1", math.MaxUint32, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&AckRoomEndRequest{Room: 7, Rank: rank, Attempt: tc.attempt}).Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate(attempt %d) = %v, want nil", tc.attempt, err)
			case tc.want != "" && (err == nil || err.Error() != tc.want):
				t.Errorf("Validate(attempt %d) = %v, want %q", tc.attempt, err, tc.want)
			}
		})
	}
}

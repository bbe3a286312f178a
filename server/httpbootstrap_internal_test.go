package server

import (
	"encoding/json"
	"slices"
	"testing"
)

// scanRoomList must agree with encoding/json wherever it answers, and
// leave every other body to it.
func TestScanRoomListAgreesWithEncodingJSON(t *testing.T) {
	for _, body := range []string{
		`{"bootstrap_rooms": [1, 2, 3]}`, `{"bootstrap_rooms":[]}`, ` { "bootstrap_rooms" : [ 0 ] } `,
		`{"bootstrap_rooms": [18446744073709551615]}`, `{"bootstrap_rooms": [18446744073709551616]}`,
		`{"bootstrap_rooms": [-1]}`, `{"bootstrap_rooms": [1.5]}`, `{"bootstrap_rooms": [01]}`, `{"bootstrap_rooms": [1e3]}`,
		`{"bootstrap_rooms": [1,]}`, `{"bootstrap_rooms": [1] , "x": 1}`, `{"other": [1]}`, `{"bootstrap_rooms": [1]}}`,
		`{"bootstrap_rooms": ["1"]}`, `{"bootstrap_rooms": [1 2]}`, `{"bootstrap_rooms": [1]`, "{\"bootstrap_rooms\":\t[7,\n8]}\n",
	} {
		got, ok := scanRoomList([]byte(body))
		var want struct {
			Rooms []uint64 `json:"bootstrap_rooms"`
		}
		err := json.Unmarshal([]byte(body), &want)
		if ok && (err != nil || !slices.Equal(got, want.Rooms) && !(len(got) == 0 && len(want.Rooms) == 0)) {
			t.Errorf("scanRoomList(%q) = %v, but encoding/json says %v, %v", body, got, want.Rooms, err)
		}
	}
	if _, ok := scanRoomList([]byte(`{"bootstrap_rooms": [1, 2, 3]}`)); !ok {
		t.Error("the fast path does not take SGLang's own body")
	}
}

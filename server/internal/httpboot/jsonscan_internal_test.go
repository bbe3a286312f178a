package httpboot

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

// scanUintObject must agree with encoding/json wherever it answers.
func TestScanUintObjectAgreesWithEncodingJSON(t *testing.T) {
	for _, body := range []string{
		`{"bootstrap_room": 5, "dp_rank": 1}`, `{"dp_rank":1,"bootstrap_room":5}`, `{}`, ` {"dp_rank": 0} `,
		`{"bootstrap_room": 18446744073709551615, "dp_rank": 0}`, `{"bootstrap_room": 18446744073709551616}`,
		`{"bootstrap_room": -5, "dp_rank": 1}`, `{"bootstrap_room": 5.0}`, `{"bootstrap_room": 05}`, `{"bootstrap_room": "5"}`,
		`{"bootstrap_room": 5, "bootstrap_room": 6}`, `{"bootstrap_room": 5, "x": 1}`, `{"bootstrap_room": 5,}`, `{"bootstrap_room": 5}x`,
		`{"bootstrap_room" 5}`, `{"bootstrap_roomx": 5}`,
	} {
		v, seen, ok := scanUintObject([]byte(body), [2]string{"bootstrap_room", "dp_rank"})
		var want struct {
			Room *uint64 `json:"bootstrap_room"`
			DP   *uint64 `json:"dp_rank"`
		}
		err := json.Unmarshal([]byte(body), &want)
		if !ok {
			continue
		}
		if err != nil || seen[0] != (want.Room != nil) || seen[1] != (want.DP != nil) ||
			seen[0] && v[0] != *want.Room || seen[1] && v[1] != *want.DP {
			t.Errorf("scanUintObject(%q) = %v %v, but encoding/json says %+v, %v", body, v, seen, want, err)
		}
	}
	if _, _, ok := scanUintObject([]byte(`{"bootstrap_room": 7000000000000000001, "dp_rank": 1}`), [2]string{"bootstrap_room", "dp_rank"}); !ok {
		t.Error("the fast path does not take SGLang's own body")
	}
}

package fieldcheck

import (
	"fmt"
	"strings"
	"testing"
)

func TestRepeatedListsTheFirstAndCountsTheRest(t *testing.T) {
	var r Repeated
	r.Add(nil)
	for i := range MaxListed + 3 {
		r.Add(Err(fmt.Sprintf("rooms[%d]", i), "bad"))
	}
	lines := strings.Split(r.Err("rooms").Error(), "\n")
	if len(lines) != MaxListed+1 || lines[0] != "rooms[0]: bad" || lines[MaxListed] != "rooms: 3 more entries are invalid" {
		t.Errorf("Err = %q", lines)
	}
	var empty Repeated
	if err := empty.Err("rooms"); err != nil {
		t.Errorf("Err with nothing recorded = %v, want nil", err)
	}
}

package kvlayout

import (
	"fmt"
	"strings"
)

// Owner is who allocates a decode instance's KV pages (kv_pool.owner).
type Owner uint8

const (
	// OwnerDaemon: the daemon's ledger admits each room under SGLang's
	// budget and chooses its pages, request row, metadata slot and state
	// slots (OpenRoom allocates; ReportRunning grows running rooms). The
	// default, for a decode engine that takes its pages from decodeplane.
	OwnerDaemon Owner = iota
	// OwnerEngine: the decode engine allocates (SGLang's and vLLM's
	// schedulers always do) and declares each room's destination
	// (DeclareDestination); the daemon holds the declared pages, rows and
	// slots from the declaration until the hand-off ends and refuses a
	// declaration that names one still held by another room.
	OwnerEngine
)

var ownerNames = [...]string{"daemon", "engine"}

// OwnerNames lists kv_pool.owner's values.
func OwnerNames() []string { return append([]string(nil), ownerNames[:]...) }

func (o Owner) String() string {
	if int(o) < len(ownerNames) {
		return ownerNames[o]
	}
	return fmt.Sprintf("Owner(%d)", int(o))
}

// ParseOwner parses kv_pool.owner (case-insensitive, as kv_pool.kind).
func ParseOwner(s string) (Owner, error) {
	v := strings.ToLower(strings.TrimSpace(s))
	for i, n := range ownerNames {
		if n == v {
			return Owner(i), nil
		}
	}
	return 0, fmt.Errorf("unknown kv_pool.owner %q (allowed: daemon, engine): set daemon when the decode engine takes its pages from decodeplane (OpenRoom admits and allocates), engine when it allocates them itself and declares each room's destination (DeclareDestination)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (o Owner) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (o *Owner) UnmarshalText(b []byte) error {
	v, err := ParseOwner(string(b))
	if err != nil {
		return err
	}
	*o = v
	return nil
}

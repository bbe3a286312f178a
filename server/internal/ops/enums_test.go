package ops

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// enumCase is one domain ↔ wire enum pair.
type enumCase struct {
	name string
	// domain returns the domain value v's name, or "" if the domain does
	// not define v (its String prints "Type(v)").
	domain func(v int) string
	// toWire maps domain value v; fromWire maps a wire value back.
	toWire   func(v int) int32
	fromWire func(w int32) (int, bool)
	wire     map[int32]string // the generated X_name map
	prefix   string           // the wire names' common prefix
	// aliases: normalised domain name → normalised wire name where they
	// differ on purpose.
	aliases map[string]string
}

// domainName is v's String unless it is the "Type(v)" fallback.
func domainName[T fmt.Stringer](v T) string {
	s := v.String()
	rv := reflect.ValueOf(v)
	n := fmt.Sprint(rv.Convert(reflect.TypeFor[int64]()).Int())
	if s == reflect.TypeOf(v).Name()+"("+n+")" {
		return ""
	}
	return s
}

func norm(s string) string { return strings.ToLower(strings.ReplaceAll(s, "_", "")) }

func tableInverse[D ~int | ~uint8, W comparable](table []W) func(int32) (int, bool) {
	return func(w int32) (int, bool) {
		var wv W
		reflect.ValueOf(&wv).Elem().SetInt(int64(w))
		d, ok := domainOf[D](table, wv)
		return int(d), ok
	}
}

func enumCases() []enumCase {
	return []enumCase{
		{
			name:     "RoomPhase",
			domain:   func(v int) string { return domainName(kvmanager.Phase(v)) },
			toWire:   func(v int) int32 { return int32(phaseToProto(kvmanager.Phase(v))) },
			fromWire: tableInverse[kvmanager.Phase](phaseWire[:]),
			wire:     pb.RoomPhase_name, prefix: "ROOM_PHASE_",
		},
		{
			name:     "KVPoll",
			domain:   func(v int) string { return domainName(kvmanager.KVPoll(v)) },
			toWire:   func(v int) int32 { return int32(pollToProto(kvmanager.KVPoll(v))) },
			fromWire: tableInverse[kvmanager.KVPoll](pollWire[:]),
			wire:     pb.KVPoll_name, prefix: "KV_POLL_",
		},
		{
			name:     "FailureCode",
			domain:   func(v int) string { return domainName(kvmanager.FailureCode(v)) },
			toWire:   func(v int) int32 { return int32(failureCodeToProto(kvmanager.FailureCode(v))) },
			fromWire: tableInverse[kvmanager.FailureCode](failureWire[:]),
			wire:     pb.FailureCode_name, prefix: "FAILURE_CODE_",
		},
		{
			name:     "DPRankRule",
			domain:   func(v int) string { return domainName(kvmanager.DPRule(v)) },
			toWire:   func(v int) int32 { return int32(dpRuleToProto(kvmanager.DPRule(v))) },
			fromWire: tableInverse[kvmanager.DPRule](dpRuleWire[:]),
			wire:     pb.DPRankRule_name, prefix: "DP_RANK_RULE_",
			// The domain's "no rule yet" is the wire's UNSPECIFIED.
			aliases: map[string]string{"none": "unspecified"},
		},
		{
			name: "StateType",
			domain: func(v int) string {
				if v == 0 { // prealloc has no zero state type; the wire's is UNSPECIFIED
					return "unspecified"
				}
				return domainName(kvlayout.StateType(v))
			},
			toWire:   func(v int) int32 { return int32(stateTypeToProto(kvlayout.StateType(v))) },
			fromWire: tableInverse[kvlayout.StateType](stateTypeWire[:]),
			wire:     pb.StateType_name, prefix: "STATE_TYPE_",
		},
	}
}

// TestEnumMappingsCoverEveryValue walks every value each domain enum names
// and every value each wire enum has: each maps to the other side, back to
// itself, and under the same name; a value outside the domain maps to the
// wire's zero value.
func TestEnumMappingsCoverEveryValue(t *testing.T) {
	for _, c := range enumCases() {
		t.Run(c.name, func(t *testing.T) {
			checkEnum(t, c)
		})
	}
}

func checkEnum(t *testing.T, c enumCase) {
	t.Helper()
	named := 0
	for v := -4; v < 256; v++ {
		dn := c.domain(v)
		w := c.toWire(v)
		if dn == "" {
			if w != 0 {
				t.Errorf("domain value %d is not defined but maps to wire %d (%s), want the zero value", v, w, c.wire[w])
			}
			continue
		}
		named++
		wn, ok := c.wire[w]
		if !ok {
			t.Errorf("domain %s (%d) maps to wire %d, which the wire enum does not define", dn, v, w)
			continue
		}
		want := norm(dn)
		if a, ok := c.aliases[want]; ok {
			want = a
		}
		if got := norm(strings.TrimPrefix(wn, c.prefix)); got != want {
			t.Errorf("domain %s (%d) maps to wire %s: the names disagree", dn, v, wn)
		}
		back, ok := c.fromWire(w)
		if !ok || back != v {
			t.Errorf("domain %s (%d) → wire %s → domain %d (ok %v), want %d back", dn, v, wn, back, ok, v)
		}
	}
	if named != len(c.wire) {
		t.Errorf("the domain names %d values, the wire enum %d", named, len(c.wire))
	}
	for w, wn := range c.wire {
		d, ok := c.fromWire(w)
		if !ok {
			t.Errorf("wire %s (%d) has no domain value", wn, w)
			continue
		}
		if c.domain(d) == "" {
			t.Errorf("wire %s (%d) maps to domain %d, which the domain does not define", wn, w, d)
		}
		if got := c.toWire(d); got != w {
			t.Errorf("wire %s (%d) → domain %d → wire %d, want %d back", wn, w, d, got, w)
		}
	}
}

// TestPhaseFromProtoUnknown: a wire phase the domain does not know (the
// validator refuses it first) is PhaseUnspecified, never a cast value.
func TestPhaseFromProtoUnknown(t *testing.T) {
	for _, w := range []pb.RoomPhase{-1, 12, 99} {
		if got := phaseFromProto(w); got != kvmanager.PhaseUnspecified {
			t.Errorf("phaseFromProto(%d) = %v, want unspecified", w, got)
		}
	}
}

package kvlayout

import (
	"slices"
	"strings"
	"testing"
)

func TestOwnerParse(t *testing.T) {
	for _, n := range OwnerNames() {
		o, err := ParseOwner(n)
		if err != nil || o.String() != n {
			t.Errorf("ParseOwner(%q) = %v, %v", n, o, err)
		}
	}
	for _, in := range []string{"Engine", " ENGINE "} {
		if o, err := ParseOwner(in); err != nil || o != OwnerEngine {
			t.Errorf("ParseOwner(%q) = %v, %v; want engine (case-insensitive, as kv_pool.kind)", in, o, err)
		}
	}
	_, err := ParseOwner("vllm")
	if err == nil || !strings.HasPrefix(err.Error(), `unknown kv_pool.owner "vllm" (allowed: daemon, engine): `) || !strings.Contains(err.Error(), "DeclareDestination") {
		t.Errorf("ParseOwner(vllm) = %v, want the value, the allowed values and what each is for", err)
	}
}

// TestEngineOwnerWarnings: with the engine as the page owner the admission
// settings it makes moot are named when set; the defaults say nothing.
func TestEngineOwnerWarnings(t *testing.T) {
	c := DefaultConfig()
	c.Pool.Owner = OwnerEngine
	if err := c.Validate(); err != nil {
		t.Fatalf("an engine-owned default pool does not validate: %v", err)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("Warnings() = %v, want none for the defaults", w)
	}
	c.Admission.ReservedDecodeTokens, c.Admission.MaxBypass = 256, 0
	var keys []string
	for _, w := range c.Warnings() {
		keys = append(keys, w.Key)
	}
	if want := []string{"admission.reserved_decode_tokens", "admission.max_bypass"}; !slices.Equal(keys, want) {
		t.Fatalf("Warnings() keys = %q, want %q", keys, want)
	}
	c.Pool.Owner = OwnerDaemon
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("Warnings() with the daemon as owner = %v, want none", w)
	}
}

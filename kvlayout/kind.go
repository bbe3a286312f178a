package kvlayout

import (
	"fmt"
	"strings"
)

// Kind is the decode KV pool's backend kind: the shape of what prefill writes
// into decode memory. It decides whether the pool is MLA (one latent vector
// per token, identical on every TP rank) or head-sliced (MHA/GQA), and which
// per-request state components travel with the KV pages.
type Kind int

// The KV pool kinds decodeplane understands. Names follow SGLang's pool
// classes.
const (
	// KindUnspecified is the zero value; a configuration must name a kind.
	KindUnspecified Kind = iota
	// KindMHA is multi-head attention (MHATokenToKVPool with KV heads == Q heads).
	KindMHA
	// KindGQA is grouped-query attention (MHATokenToKVPool with fewer KV heads).
	KindGQA
	// KindMLA is multi-head latent attention (MLATokenToKVPool, DeepSeek V2/V3):
	// one kv_lora_rank + qk_rope_head_dim vector per token and layer.
	KindMLA
	// KindHybridMLA is DSA/NSA-style sparse MLA (NSATokenToKVPool, DeepSeek
	// V3.2): MLA KV plus indexer-K pages sent as the DSA state component.
	// NSATokenToKVPool subclasses MLATokenToKVPool, so SGLang's
	// is_mla_backend is true for it.
	KindHybridMLA
	// KindHybridSWA is a full-attention MHA/GQA pool plus a sliding-window
	// pool (SWAKVPool); the SWA window pages travel as the SWA state component.
	KindHybridSWA
	// KindHybridLinear is a full-attention MHA/GQA pool plus per-request
	// linear-attention (Mamba/GDN) state slots (HybridLinearKVPool).
	KindHybridLinear
)

var kindNames = [...]string{
	KindUnspecified:  "",
	KindMHA:          "mha",
	KindGQA:          "gqa",
	KindMLA:          "mla",
	KindHybridMLA:    "hybrid-mla",
	KindHybridSWA:    "hybrid-swa",
	KindHybridLinear: "hybrid-linear",
}

// KindNames lists the accepted spellings of every kind, in declaration order.
func KindNames() []string { return append([]string(nil), kindNames[1:]...) }

// ParseKind parses a kind name (case-insensitive; "_" and "-" are equivalent).
func ParseKind(s string) (Kind, error) {
	norm := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "_", "-")
	for k, name := range kindNames {
		if k != int(KindUnspecified) && name == norm {
			return Kind(k), nil
		}
	}
	return KindUnspecified, fmt.Errorf("unknown kv pool kind %q (allowed: %s)", s, strings.Join(KindNames(), ", "))
}

// String returns the kind's configuration spelling.
func (k Kind) String() string {
	if k < 0 || int(k) >= len(kindNames) {
		return fmt.Sprintf("Kind(%d)", int(k))
	}
	if k == KindUnspecified {
		return "unspecified"
	}
	return kindNames[k]
}

// Known reports whether k is one of the declared kinds (not
// KindUnspecified, not out of range).
func (k Kind) Known() bool { return k > KindUnspecified && int(k) < len(kindNames) }

// pool names a pool of the kind for messages: "an MLA pool", "a GQA pool".
func (k Kind) pool() string {
	switch k {
	case KindMHA:
		return "an MHA pool"
	case KindGQA:
		return "a GQA pool"
	case KindMLA:
		return "an MLA pool"
	case KindHybridMLA:
		return "a hybrid-MLA pool"
	case KindHybridSWA:
		return "a hybrid-SWA pool"
	case KindHybridLinear:
		return "a hybrid-linear pool"
	}
	return "a pool of kind " + k.String()
}

// MarshalText implements encoding.TextMarshaler.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (k *Kind) UnmarshalText(b []byte) error {
	v, err := ParseKind(string(b))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// IsMLA reports SGLang's is_mla_backend for the pool: true for MLATokenToKVPool
// and its subclasses (NSATokenToKVPool), false otherwise. MLA pools have no KV
// heads to slice: heterogeneous TP uses one real source rank plus dummy
// targets, and the staging buffer must not be used.
func (k Kind) IsMLA() bool { return k == KindMLA || k == KindHybridMLA }

// HasHeads reports whether the pool stores per-head K and V (MHA/GQA and the
// hybrids built on them), so that heterogeneous TP slices heads.
func (k Kind) HasHeads() bool {
	return k == KindMHA || k == KindGQA || k == KindHybridSWA || k == KindHybridLinear
}

// StateType is one per-request state component that travels with the KV pages
// (SGLang's StateType). Order matters: both sides agree on it.
type StateType int

// State components.
const (
	StateMamba StateType = iota + 1
	StateSWA
	StateDSA
)

// String returns SGLang's name for the state type.
func (s StateType) String() string {
	switch s {
	case StateMamba:
		return "MAMBA"
	case StateSWA:
		return "SWA"
	case StateDSA:
		return "DSA"
	}
	return fmt.Sprintf("StateType(%d)", int(s))
}

// StateTypes returns the ordered state components the kind sends per request.
func (k Kind) StateTypes() []StateType {
	switch k {
	case KindHybridMLA:
		return []StateType{StateDSA}
	case KindHybridSWA:
		return []StateType{StateSWA}
	case KindHybridLinear:
		return []StateType{StateMamba}
	}
	return nil
}

// StateIndices are one state component's destination indices
// (SGLang's state_indices entry for one StateType).
type StateIndices struct {
	Type    StateType
	Indices []int32
}

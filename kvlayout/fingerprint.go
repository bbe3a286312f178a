package kvlayout

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ModelConfig names the model a decode instance serves (model). Both
// settings are optional. When set they are part of the daemon's
// fingerprint (what routers compare before pairing a prefill with it), and
// a prefill that names another model, or the same model at another
// revision (RegisterPrefillRequest.model), is refused at registration.
type ModelConfig struct {
	// Name is the served model's name, as the engine serves it (SGLang's
	// --served-model-name, e.g. meta-llama/Llama-3.1-8B-Instruct).
	Name string `yaml:"name"`
	// Revision is the model's revision (a commit hash or tag); it needs
	// Name.
	Revision string `yaml:"revision"`
}

// Bounds of model.name and model.revision (and of the model names a prefill
// registration carries).
const (
	MaxModelNameLen     = 256
	MaxModelRevisionLen = 128
)

// CheckModelID reports why s is not a model name or revision of at most
// maxLen bytes: valid UTF-8, printable, no whitespace ("" when it is).
func CheckModelID(s string, maxLen int) string {
	switch {
	case len(s) > maxLen:
		return fmt.Sprintf("is %d bytes long (at most %d)", len(s), maxLen)
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.ContainsFunc(s, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }):
		return "holds whitespace or a control character"
	}
	return ""
}

func (m ModelConfig) validate(v *validator) {
	if p := CheckModelID(m.Name, MaxModelNameLen); p != "" {
		v.add("model.name", m.Name, "the model name "+p+".", "set it to the served model's name as the engine serves it (e.g. meta-llama/Llama-3.1-8B-Instruct), or leave it empty.")
	}
	if p := CheckModelID(m.Revision, MaxModelRevisionLen); p != "" {
		v.add("model.revision", m.Revision, "the model revision "+p+".", "set it to the model's commit hash or tag, or leave it empty.")
	} else if m.Revision != "" && m.Name == "" {
		v.add("model.revision", m.Revision, "a revision without model.name names no model.", "set model.name too, or leave model.revision empty.")
	}
}

// Fingerprint is what a prefill's KV must match for a decode pool to take
// it: the decode side's half of the registration's compatibility check,
// which a daemon publishes to its fleet and to routers so that an
// incompatible pair is dropped before any request is dispatched.
type Fingerprint struct {
	PageSize int
	DType    string // canonical (CanonicalDType)
	Kind     Kind
	// NumLayers are the attention layers whose KV is transferred.
	NumLayers int
	// TotalKVHeads is the model's KV heads (0 on an MLA pool); HeadDim
	// the per-head dimension, or on an MLA pool one KV entry's width,
	// KVLoraRank + QKRopeHeadDim (0 elsewhere).
	TotalKVHeads              int
	HeadDim                   int
	KVLoraRank, QKRopeHeadDim int
	// Owner is who allocates the pool's pages (kv_pool.owner): routers
	// read it; a prefill's KV does not depend on it.
	Owner Owner
	// ModelName and ModelRevision are model.name and model.revision ("":
	// not configured).
	ModelName, ModelRevision string
}

// Fingerprint is the layout's fingerprint.
func (l Layout) Fingerprint() Fingerprint {
	return Fingerprint{PageSize: l.PageSize, DType: l.DType, Kind: l.Kind, NumLayers: l.NumLayers, TotalKVHeads: l.TotalKVHeads,
		HeadDim: l.HeadDim, KVLoraRank: l.KVLoraRank, QKRopeHeadDim: l.QKRopeHeadDim, Owner: l.Owner,
		ModelName: l.ModelName, ModelRevision: l.ModelRevision}
}

// Digest is 16 hex digits of a SHA-256 over every field: two decode pools
// with the same digest accept the same prefills (the reverse need not
// hold: the page owner is in it).
func (f Fingerprint) Digest() string {
	s := fmt.Sprintf("decodeplane-fingerprint-v1\x00%d\x00%s\x00%s\x00%d\x00%d\x00%d\x00%d\x00%d\x00%s\x00%s\x00%s",
		f.PageSize, f.DType, f.Kind, f.NumLayers, f.TotalKVHeads, f.HeadDim, f.KVLoraRank, f.QKRopeHeadDim, f.Owner, f.ModelName, f.ModelRevision)
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

// String is the fingerprint on one line, for logs and decodectl.
func (f Fingerprint) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s, %d layers, ", f.Kind, f.NumLayers)
	if f.Kind.IsMLA() {
		fmt.Fprintf(&b, "kv_lora_rank %d + qk_rope_head_dim %d", f.KVLoraRank, f.QKRopeHeadDim)
	} else {
		fmt.Fprintf(&b, "%d KV heads x %d", f.TotalKVHeads, f.HeadDim)
	}
	fmt.Fprintf(&b, ", %s, page %d, owner %s", f.DType, f.PageSize, f.Owner)
	if f.ModelName != "" {
		b.WriteString(", model " + f.ModelName)
		if f.ModelRevision != "" {
			b.WriteString("@" + f.ModelRevision)
		}
	}
	return b.String()
}

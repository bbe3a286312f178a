package decodeplanev1

import (
	"strings"
	"testing"
)

// TestFingerprintValidate: a fingerprint read from another daemon's fleet
// record is checked against the bounds common.proto states; each
// refusal names the field.
func TestFingerprintValidate(t *testing.T) {
	good := func() *Fingerprint {
		return &Fingerprint{PageSize: 64, KvCacheDtype: "bf16", KvPoolKind: "gqa", NumLayers: 32, TotalKvHeads: 8, HeadDim: 128,
			PageOwner: "daemon", ModelName: "meta-llama/Llama-3.1-8B-Instruct", ModelRevision: "0e9e39f", Digest: "0123456789abcdef"}
	}
	tests := []struct {
		name string
		mod  func(*Fingerprint)
		want string // "" = valid
	}{
		{"ok", func(*Fingerprint) {}, ""},
		{"no model", func(f *Fingerprint) { f.ModelName, f.ModelRevision = "", "" }, ""},
		{"page size not a power of two", func(f *Fingerprint) { f.PageSize = 48 }, "page_size: 48 must be a power of two"},
		{"page size 0", func(f *Fingerprint) { f.PageSize = 0 }, "page_size"},
		{"page size too large", func(f *Fingerprint) { f.PageSize = 1 << 17 }, "page_size"},
		{"dtype not canonical", func(f *Fingerprint) { f.KvCacheDtype = "auto" }, "kv_cache_dtype"},
		{"unknown kind", func(f *Fingerprint) { f.KvPoolKind = "paged" }, "kv_pool_kind"},
		{"no layers", func(f *Fingerprint) { f.NumLayers = 0 }, "num_layers: is 0"},
		{"too many layers", func(f *Fingerprint) { f.NumLayers = MaxModelLayers + 1 }, "num_layers"},
		{"too many heads", func(f *Fingerprint) { f.TotalKvHeads = MaxModelHeads + 1 }, "total_kv_heads"},
		{"no head dim", func(f *Fingerprint) { f.HeadDim = 0 }, "head_dim: is 0"},
		{"lora rank too large", func(f *Fingerprint) { f.KvLoraRank = MaxModelDim + 1 }, "kv_lora_rank"},
		{"rope dim too large", func(f *Fingerprint) { f.QkRopeHeadDim = MaxModelDim + 1 }, "qk_rope_head_dim"},
		{"unknown owner", func(f *Fingerprint) { f.PageOwner = "router" }, "page_owner"},
		{"model name with a space", func(f *Fingerprint) { f.ModelName = "llama 3" }, "model_name"},
		{"model name too long", func(f *Fingerprint) { f.ModelName = strings.Repeat("m", MaxModelNameLen+1) }, "model_name: is 257 bytes long"},
		{"revision too long", func(f *Fingerprint) { f.ModelRevision = strings.Repeat("r", MaxModelRevisionLen+1) }, "model_revision: is 129 bytes long"},
		{"digest upper case", func(f *Fingerprint) { f.Digest = "0123456789ABCDEF" }, "digest"},
		{"digest short", func(f *Fingerprint) { f.Digest = "0123" }, "digest"},
	}
	for _, tc := range tests {
		f := good()
		tc.mod(f)
		err := f.Validate()
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if err := (*Fingerprint)(nil).Validate(); err == nil || !strings.Contains(err.Error(), "fingerprint: is required") {
		t.Errorf("nil fingerprint: %v", err)
	}
}

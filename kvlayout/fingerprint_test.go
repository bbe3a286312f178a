package kvlayout

import (
	"errors"
	"strings"
	"testing"
)

// TestModelConfigValidate: model.name and model.revision are optional;
// when set each is bounded printable UTF-8 without whitespace, and a
// revision needs a name. Each refusal names the setting, the value and the
// fix.
func TestModelConfigValidate(t *testing.T) {
	tests := []struct {
		name, model, rev string
		wantKey, want    string
	}{
		{name: "none"},
		{name: "both", model: "meta-llama/Llama-3.1-8B-Instruct", rev: "0e9e39f"},
		{name: "name only", model: "m1"},
		{name: "space in the name", model: "llama 3", wantKey: "model.name", want: `model.name = "llama 3": the model name holds whitespace or a control character. Fix: set it to the served model's name`},
		{name: "name too long", model: strings.Repeat("m", MaxModelNameLen+1), wantKey: "model.name", want: "the model name is 257 bytes long (at most 256)."},
		{name: "bad UTF-8", model: "m\xff", wantKey: "model.name", want: "is not valid UTF-8"},
		{name: "revision too long", model: "m", rev: strings.Repeat("r", MaxModelRevisionLen+1), wantKey: "model.revision", want: "the model revision is 129 bytes long (at most 128)."},
		{name: "control character in the revision", model: "m", rev: "r\t1", wantKey: "model.revision", want: "holds whitespace or a control character"},
		{name: "revision without a name", rev: "r1", wantKey: "model.revision", want: `model.revision = "r1": a revision without model.name names no model. Fix: set model.name too, or leave model.revision empty.`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Model = ModelConfig{Name: tc.model, Revision: tc.rev}
			err := c.Validate()
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.wantKey || !strings.Contains(err.Error(), tc.want) || ce.Fix == "" {
				t.Fatalf("Validate() = %v; want a ConfigError on %s containing %q, with a fix", err, tc.wantKey, tc.want)
			}
		})
	}
}

// TestFingerprintDigest: the digest is 16 lowercase hex digits, the same
// for the same fields, and changes with every field a prefill is checked
// against (and with the page owner).
func TestFingerprintDigest(t *testing.T) {
	c := DefaultConfig()
	c.Model = ModelConfig{Name: "m1", Revision: "r1"}
	base := c.Layout().Fingerprint()
	d := base.Digest()
	if len(d) != 16 || strings.Trim(d, "0123456789abcdef") != "" {
		t.Fatalf("Digest() = %q, want 16 lowercase hex digits", d)
	}
	if again := c.Layout().Fingerprint().Digest(); again != d {
		t.Fatalf("Digest() is not stable: %s then %s", d, again)
	}
	mods := map[string]func(*Fingerprint){
		"page size": func(f *Fingerprint) { f.PageSize = 32 },
		"dtype":     func(f *Fingerprint) { f.DType = "fp8_e4m3" },
		"kind":      func(f *Fingerprint) { f.Kind = KindMHA },
		"layers":    func(f *Fingerprint) { f.NumLayers = 61 },
		"heads":     func(f *Fingerprint) { f.TotalKVHeads = 4 },
		"head dim":  func(f *Fingerprint) { f.HeadDim = 64 },
		"lora rank": func(f *Fingerprint) { f.KVLoraRank = 512 },
		"rope dim":  func(f *Fingerprint) { f.QKRopeHeadDim = 64 },
		"owner":     func(f *Fingerprint) { f.Owner = OwnerEngine },
		"model":     func(f *Fingerprint) { f.ModelName = "m2" },
		"revision":  func(f *Fingerprint) { f.ModelRevision = "r2" },
		// The separator keeps adjacent fields apart.
		"name/revision boundary": func(f *Fingerprint) { f.ModelName, f.ModelRevision = "m1r", "1" },
	}
	for name, mod := range mods {
		f := base
		mod(&f)
		if f.Digest() == d {
			t.Errorf("changing the %s leaves the digest %s", name, d)
		}
	}
	if got, want := base.String(), "gqa, 32 layers, 8 KV heads x 128, bf16, page 64, owner daemon, model m1@r1"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

// TestMLAFingerprint: an MLA pool's fingerprint carries its latent
// dimensions, head_dim their sum, and no KV heads.
func TestMLAFingerprint(t *testing.T) {
	c := DefaultConfig()
	c.Pool.Kind, c.Pool.KVHeads, c.Pool.HeadDim, c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = KindMLA, 0, 0, 512, 64
	if err := c.Validate(); err != nil {
		t.Fatalf("the MLA configuration does not validate: %v", err)
	}
	f := c.Layout().Fingerprint()
	if f.TotalKVHeads != 0 || f.HeadDim != 576 || f.KVLoraRank != 512 || f.QKRopeHeadDim != 64 {
		t.Fatalf("MLA fingerprint = %+v", f)
	}
	if got := f.String(); !strings.Contains(got, "kv_lora_rank 512 + qk_rope_head_dim 64") {
		t.Errorf("String() = %q, want the MLA dimensions", got)
	}
}

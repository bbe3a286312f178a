package registry

import (
	"fmt"
	"math"
	"strings"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/ranks"
)

// This file holds the checks of a registration against this decode
// instance: SGLang's fatal compatibility checks, the model's facts against
// the fingerprint, SGLang's rank mapping and the rank within its layout.

// checkCompat checks a registration against this decode pool (Compat).
func (g *Registry) checkCompat(reg Registration) error { return Compat(reg, g.fp) }

// Compat applies SGLang's fatal checks (topology fetch, decode startup) and
// the model facts of a registration against a decode pool's fingerprint:
// this daemon's own at registration, another daemon's when a fleet tells
// which daemons can take a prefill's KV. Messages are SGLang's where it has
// them. A kv_pool_kind that is no kind at all is a bad value (InvalidError,
// InvalidArgument); everything that contradicts the pool is
// ErrPrefillMismatch (FailedPrecondition), every contradiction named at
// once ("; " between SGLang's page size and dtype messages and the list of
// the model's).
func Compat(reg Registration, fp kvlayout.Fingerprint) error {
	f := reg.Model
	var kind kvlayout.Kind
	if f.Kind != "" {
		k, err := kvlayout.ParseKind(f.Kind)
		if err != nil {
			return invalid("model.kv_pool_kind", "%q is not a KV pool kind (allowed: %s)", f.Kind, strings.Join(kvlayout.KindNames(), ", "))
		}
		kind = k
	}
	var parts []string
	if reg.PageSize != fp.PageSize {
		parts = append(parts, fmt.Sprintf("Page size mismatch: prefill server has page_size=%d, but decode server has page_size=%d. Both servers must use the same --page-size value.", reg.PageSize, fp.PageSize))
	}
	pd, ok := kvlayout.CanonicalDType(reg.KVDType)
	if strings.EqualFold(strings.TrimSpace(reg.KVDType), "auto") && (fp.DType == "bf16" || fp.DType == "fp16") {
		pd, ok = fp.DType, true
	}
	if !ok || pd != fp.DType {
		parts = append(parts, fmt.Sprintf("KV cache dtype mismatch: prefill server has kv_cache_dtype=%s, but decode server has kv_cache_dtype=%s. Both servers must use the same --kv-cache-dtype value.", reg.KVDType, fp.DType))
	}
	if pp := reg.Parallel.PP; fp.NumLayers > 0 && pp > fp.NumLayers {
		parts = append(parts, fmt.Sprintf("parallel.pp_size=%d exceeds the model's %d layers: a pipeline stage would hold no layer, so its KV could not be mapped onto the decode pool", pp, fp.NumLayers))
	}
	if bad := modelDifferences(f, kind, fp); len(bad) > 0 {
		parts = append(parts, "the prefill's model does not match the decode KV pool: "+strings.Join(bad, ", "))
	}
	if len(parts) > 0 {
		return fmt.Errorf("%w: %s", ErrPrefillMismatch, strings.Join(parts, "; "))
	}
	return nil
}

// modelDifferences lists the model facts that contradict the pool (zero
// facts are not checked).
func modelDifferences(f ModelFacts, kind kvlayout.Kind, fp kvlayout.Fingerprint) []string {
	var bad []string
	if f.Kind != "" && kind != fp.Kind {
		bad = append(bad, fmt.Sprintf("kv_pool_kind %q (decode: %s)", f.Kind, fp.Kind))
	}
	check := func(name string, got, want int) {
		if got != 0 && got != want {
			bad = append(bad, fmt.Sprintf("%s %d (decode: %d)", name, got, want))
		}
	}
	check("num_layers", f.NumLayers, fp.NumLayers)
	if fp.Kind.IsMLA() {
		if f.TotalKVHeads > 1 {
			bad = append(bad, fmt.Sprintf("total_kv_heads %d (decode: %s pool, one latent KV vector per token)", f.TotalKVHeads, fp.Kind))
		}
		// On an MLA pool head_dim is the width of one KV entry.
		check("head_dim", f.HeadDim, fp.HeadDim)
		if f.KVLoraRank != 0 || f.QKRopeHeadDim != 0 {
			check("kv_lora_rank + qk_rope_head_dim", f.KVLoraRank+f.QKRopeHeadDim, fp.HeadDim)
		}
	} else {
		check("total_kv_heads", f.TotalKVHeads, fp.TotalKVHeads)
		check("head_dim", f.HeadDim, fp.HeadDim)
		if f.KVLoraRank != 0 {
			bad = append(bad, fmt.Sprintf("kv_lora_rank %d (decode: %s pool, which has no latent dimension)", f.KVLoraRank, fp.Kind))
		}
		if f.QKRopeHeadDim != 0 {
			bad = append(bad, fmt.Sprintf("qk_rope_head_dim %d (decode: %s pool, which has no decoupled RoPE part)", f.QKRopeHeadDim, fp.Kind))
		}
	}
	if f.ModelName != "" && fp.ModelName != "" && f.ModelName != fp.ModelName {
		bad = append(bad, fmt.Sprintf("model_name %q (decode: %q)", f.ModelName, fp.ModelName))
	} else if f.ModelRevision != "" && fp.ModelRevision != "" && f.ModelRevision != fp.ModelRevision {
		bad = append(bad, fmt.Sprintf("model_revision %q (decode: %q)", f.ModelRevision, fp.ModelRevision))
	}
	return bad
}

// Mapping is SGLang's mapping of this decode side against a prefill
// topology. It is computed per call and never kept: its lists grow with the
// prefill's sizes, and an instance must cost the same whatever they are.
func (g *Registry) Mapping(topo PrefillTopology) ([]DecodeRankMapping, error) {
	l := g.cfg.Layout
	return ranks.Mapping(l.AttnTP, l.PP, l.IsMLA, l.Kind == kvlayout.KindHybridMLA, topo)
}

// rankCount is the number of ranks an instance registers: dp × cp × tp × pp,
// saturating instead of overflowing (sizes are client-chosen). Registration
// completes when exactly that many distinct in-layout ranks registered; an
// instance whose count no deployment reaches simply never completes, and
// costs one table entry per RegisterPrefill call received.
func rankCount(p PrefillTopology) int {
	n := 1
	for _, f := range []int{p.DP, p.AttnCP, p.AttnTP, p.PP} {
		f = max(1, f)
		if n > math.MaxInt/f {
			return math.MaxInt
		}
		n *= f
	}
	return n
}

// checkRankInLayout refuses a rank outside its own parallel sizes: the
// registration count is exact only if every rank it counts exists.
func checkRankInLayout(par ParallelInfo, id RankID, topo PrefillTopology) error {
	dpField, dpSize := "parallel.attn_dp_rank", "parallel.attn_dp_size"
	if par.SystemDP > 1 {
		dpField, dpSize = "parallel.system_dp_rank", "parallel.system_dp_size"
	}
	for _, c := range []struct {
		field, sizeField string
		rank, size       int
	}{
		{"parallel.attn_tp_rank", "parallel.attn_tp_size", id.TP, topo.AttnTP},
		{"parallel.attn_cp_rank", "parallel.attn_cp_size", id.CP, topo.AttnCP},
		{dpField, dpSize, id.DP, topo.DP},
		{"parallel.pp_rank", "parallel.pp_size", id.PP, topo.PP},
	} {
		if c.rank < 0 || c.rank >= c.size {
			return invalid(c.field, "%d is outside %s %d (allowed 0..%d)", c.rank, c.sizeField, c.size, c.size-1)
		}
	}
	return nil
}

package decodeplanev1

import (
	"errors"
	"slices"
)

// FingerprintDTypes are the canonical KV dtypes a Fingerprint names
// (kvlayout's canonical spellings).
var FingerprintDTypes = []string{"bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2"}

// PageOwners are the values of Fingerprint.page_owner (kv_pool.owner).
var PageOwners = []string{"daemon", "engine"}

// Validate checks a fingerprint against the bounds common.proto
// states. A daemon publishes its own; one read from another daemon's fleet
// record is checked here before it is used, and ignored when it fails.
func (x *Fingerprint) Validate() error {
	if x == nil {
		return fieldErr("fingerprint", "is required")
	}
	var errs []error
	if ps := x.GetPageSize(); ps == 0 || ps&(ps-1) != 0 || ps > MaxPageSize {
		errs = append(errs, fieldErr("page_size", "%d must be a power of two in 1..%d", ps, MaxPageSize))
	}
	if !slices.Contains(FingerprintDTypes, x.GetKvCacheDtype()) {
		errs = append(errs, fieldErr("kv_cache_dtype", "%s is not a canonical KV dtype (allowed: bf16, fp16, fp32, fp8_e4m3, fp8_e5m2)", short(x.GetKvCacheDtype())))
	}
	if !slices.Contains(KVPoolKinds, x.GetKvPoolKind()) {
		errs = append(errs, fieldErr("kv_pool_kind", "%s is not a KV pool kind (allowed: mha, gqa, mla, hybrid-mla, hybrid-swa, hybrid-linear)", short(x.GetKvPoolKind())))
	}
	if n := x.GetNumLayers(); n == 0 {
		errs = append(errs, fieldErr("num_layers", "is 0 (allowed 1..%d)", MaxModelLayers))
	}
	if d := x.GetHeadDim(); d == 0 {
		errs = append(errs, fieldErr("head_dim", "is 0 (allowed 1..%d)", MaxModelDim))
	}
	errs = append(errs,
		checkMax("num_layers", uint64(x.GetNumLayers()), MaxModelLayers),
		checkMax("total_kv_heads", uint64(x.GetTotalKvHeads()), MaxModelHeads),
		checkMax("head_dim", uint64(x.GetHeadDim()), MaxModelDim),
		checkMax("kv_lora_rank", uint64(x.GetKvLoraRank()), MaxModelDim),
		checkMax("qk_rope_head_dim", uint64(x.GetQkRopeHeadDim()), MaxModelDim),
		checkModelID("model_name", x.GetModelName(), MaxModelNameLen),
		checkModelID("model_revision", x.GetModelRevision(), MaxModelRevisionLen))
	if !slices.Contains(PageOwners, x.GetPageOwner()) {
		errs = append(errs, fieldErr("page_owner", "%s is not a page owner (allowed: daemon, engine)", short(x.GetPageOwner())))
	}
	if d := x.GetDigest(); len(d) != 16 || !isLowerHex(d) {
		errs = append(errs, fieldErr("digest", "%s is not 16 lowercase hex digits", short(d)))
	}
	return errors.Join(errs...)
}

func isLowerHex(s string) bool {
	for i := range len(s) {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

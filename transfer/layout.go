package transfer

import (
	"fmt"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// With an engine layout (ChunkOp.Engine) a chunk moves, for each non-dummy
// target (a decode TP rank) and as SGLang's transfer code computes it
// (src + prefill_page × item_len → dst + decode_page × item_len):
//
//   - per destination page, every KV buffer of the prefill rank's PP stage
//     (the model's layers of the stage; the draft model's buffers from the
//     last stage): the whole item when the prefill rank's heads are the
//     decode rank's (and for MLA), else the head share, item_len ×
//     num_heads / heads_per_rank;
//   - with the last chunk of a rank of the last PP stage, one row of every
//     aux buffer but the marker's, and the state items (one Mamba slot;
//     every declared SWA page);
//   - with every rank's last chunk, the 8-byte room marker.
//
// Whole pages: a partial last page weighs its whole item, as SGLang copies
// it. The prefill rank's buffers at the transfer agent are named from the
// chunk's source.buffer, a prefix (PrefillKVName, PrefillAuxName,
// PrefillStateName).

// PrefillKVName is the prefill rank's buffer that holds what decode buffer
// b holds: prefix/k/<layer> or prefix/v/<layer> (MLA's latent buffers are
// K), prefix/draft/k/<layer> and prefix/draft/v/<layer> for the draft model.
// Layers are the model's (a PP stage names its own layers).
func PrefillKVName(prefix string, b kvlayout.KVBuffer) string {
	kv := "k"
	if b.Value {
		kv = "v"
	}
	if b.Draft {
		return fmt.Sprintf("%s/draft/%s/%d", prefix, kv, b.Layer)
	}
	return fmt.Sprintf("%s/%s/%d", prefix, kv, b.Layer)
}

// PrefillAuxName is the prefill rank's aux buffer i (the decode layout's
// aux[i]): prefix/aux/<i>.
func PrefillAuxName(prefix string, i int) string { return fmt.Sprintf("%s/aux/%d", prefix, i) }

// PrefillStateName is the prefill rank's state buffer j (the decode
// layout's state[j]): prefix/state/<j>.
func PrefillStateName(prefix string, j int) string { return fmt.Sprintf("%s/state/%d", prefix, j) }

// SendsKV reports whether a rank of PP stage ppRank (of prefillPP) sends
// buffer b: the model's layers of its stage, the draft model's from the
// last stage.
func SendsKV(l kvlayout.Layout, b kvlayout.KVBuffer, prefillPP, ppRank int) bool {
	if b.Draft {
		return ppRank == max(1, prefillPP)-1
	}
	lb, le := StageLayers(l.NumLayers, max(1, prefillPP), ppRank)
	return b.Layer >= lb && b.Layer < le
}

// LastStage reports whether ppRank is the last PP stage: its ranks send the
// aux rows and the state.
func LastStage(prefillPP, ppRank int) bool { return ppRank == max(1, prefillPP)-1 }

// StateItems is how many items of state type t a room's last chunk moves:
// one Mamba slot (the request's main slot), every SWA page declared.
func StateItems(t kvlayout.StateType, state []kvlayout.StateIndices) int {
	for _, s := range state {
		if s.Type != t {
			continue
		}
		if t == kvlayout.StateMamba {
			return min(1, len(s.Indices))
		}
		return len(s.Indices)
	}
	return 0
}

// LayoutWeights is what one prefill rank moves into its targets with an
// engine layout: per destination page, and with its last chunk the aux
// rows and the marker (aux) and the state items (state). A target without
// a layout weighs nothing (the room's declaration needs one per TP rank).
func LayoutWeights(engine []*kvlayout.BufferLayout, l kvlayout.Layout, targets []Target, prefillPP, ppRank int, roomState []kvlayout.StateIndices) (page, aux, state int64) {
	last := LastStage(prefillPP, ppRank)
	for _, t := range targets {
		if t.Dummy || t.DecodeTP < 0 || t.DecodeTP >= len(engine) || engine[t.DecodeTP] == nil {
			continue
		}
		el := engine[t.DecodeTP]
		for _, b := range el.KV {
			if SendsKV(l, b, prefillPP, ppRank) {
				page += b.HeadShare(l.IsMLA, l.HeadsPerRank, t.NumHeads)
			}
		}
		aux += kvlayout.MarkerBytes
		if !last {
			continue
		}
		for _, a := range el.Aux {
			if a.Name != el.Marker {
				aux += a.RowLen
			}
		}
		for _, s := range el.State {
			state += s.ItemLen * int64(StateItems(s.Type, roomState))
		}
	}
	return page, aux, state
}

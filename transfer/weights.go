package transfer

import "github.com/decodeplane/decodeplane/kvlayout"

// StageLayers is the layer range [begin, end) of PP stage of n over layers
// layers: [stage·layers/n, (stage+1)·layers/n).
func StageLayers(layers, n, stage int) (begin, end int) {
	n = max(1, n)
	return stage * layers / n, (stage + 1) * layers / n
}

// ChunkBytes is what a chunk moves over the wire from one prefill rank:
// tokens x the rank's per-token weight, plus on the last chunk the
// per-request state (RankWeights); with an engine layout (op.Engine), its
// pages x the rank's page weight, plus on the last chunk the aux rows, the
// marker and the state items (LayoutWeights).
func ChunkBytes(op ChunkOp) int64 {
	if len(op.Engine) > 0 {
		page, aux, state := LayoutWeights(op.Engine, op.Layout, op.Targets, op.PrefillPP, op.Rank.PP, op.State)
		total := int64(len(op.DestPages)) * page
		if op.Last {
			total += aux + state
		}
		return total
	}
	perToken, state := RankWeights(op.Layout, op.Targets, op.PrefillPP, op.Rank.PP)
	total := int64(op.Tokens) * perToken
	if op.Last {
		total += state
	}
	return total
}

// RankWeights is what one prefill rank moves per token, and with its last
// chunk, into its decode targets: per non-dummy target, the heads it receives
// (MHA/GQA: 2 x heads x head_dim x dtype x layers; MLA: (latent + rope) x
// dtype x layers, plus the DSA indexer row) over the layers of the rank's PP
// stage (all of them when prefill PP is 1), and the Mamba state per target.
func RankWeights(l kvlayout.Layout, targets []Target, prefillPP, ppRank int) (perToken, state int64) {
	layers := int64(l.NumLayers)
	if prefillPP > 1 {
		b, e := StageLayers(l.NumLayers, prefillPP, ppRank)
		layers = int64(e - b)
	}
	for _, t := range targets {
		if t.Dummy {
			continue
		}
		if l.IsMLA {
			perToken += (l.HeadBytes() + int64(l.DSAIndexBytes)) * layers
		} else {
			heads := t.NumHeads
			if heads == 0 {
				heads = l.HeadsPerRank
			}
			perToken += 2 * int64(heads) * l.HeadBytes() * layers
		}
		if l.Kind == kvlayout.KindHybridLinear {
			state += l.MambaBytes
		}
	}
	return perToken, state
}

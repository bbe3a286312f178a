package transfer_test

import (
	"fmt"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// kvLayout is a decode rank's SGLang-shaped layout: 4 layers' K then V
// buffers of item bytes, n draft layers, aux columns of the given rows
// (the last the marker's), and state buffers.
func kvLayout(item int64, draft int, rows []int64, state ...kvlayout.StateBuffer) *kvlayout.BufferLayout {
	l := &kvlayout.BufferLayout{Marker: fmt.Sprintf("aux%d", len(rows)-1), State: state}
	for _, isDraft := range []bool{false, true} {
		n := 4
		if isDraft {
			n = draft
		}
		for kv := range 2 {
			for layer := range n {
				l.KV = append(l.KV, kvlayout.KVBuffer{Name: fmt.Sprintf("d%v/%d/%d", isDraft, kv, layer), Layer: layer, Value: kv == 1, Draft: isDraft, ItemLen: item})
			}
		}
	}
	for i, r := range rows {
		l.Aux = append(l.Aux, kvlayout.AuxBuffer{Name: fmt.Sprintf("aux%d", i), RowLen: r})
	}
	return l
}

// TestLayoutWeights: with an engine layout a prefill rank weighs, per
// destination page, its share of every KV buffer of its PP stage, and with
// its last chunk the aux rows (last stage), the marker and the state
// items, per non-dummy target.
func TestLayoutWeights(t *testing.T) {
	gqa := layoutOf(t, func(c *kvlayout.Config) { c.Pool.NumLayers = 4; c.Parallel.AttnTP = 2 }) // 4 heads per rank, item 64 × 4 × 256 = 65,536
	item := gqa.ItemLen()
	el := kvLayout(item, 0, []int64{64, 16, 64})
	two := []*kvlayout.BufferLayout{el, el}
	mamba := []kvlayout.StateIndices{{Type: kvlayout.StateMamba, Indices: []int32{3, 4}}}
	swa := []kvlayout.StateIndices{{Type: kvlayout.StateSWA, Indices: []int32{1, 2, 5}}}
	for _, tc := range []struct {
		name                string
		engine              []*kvlayout.BufferLayout
		targets             []transfer.Target
		pp, ppRank          int
		state               []kvlayout.StateIndices
		page, aux, stateLen int64
	}{
		{"equal TP: whole items", two, []transfer.Target{{DecodeTP: 1, NumHeads: 4}}, 1, 0, nil, 8 * item, 8 + 64 + 16, 0},
		{"prefill TP 4: half of each item", two, []transfer.Target{{DecodeTP: 0, NumHeads: 2, DstHeadStart: 2}}, 1, 0, nil, 8 * item / 2, 8 + 80, 0},
		{"prefill TP 1: two targets", two, []transfer.Target{{DecodeTP: 0, NumHeads: 4}, {DecodeTP: 1, SrcHeadStart: 4, NumHeads: 4}}, 1, 0, nil, 16 * item, 2 * 88, 0},
		{"a dummy target weighs nothing", two, []transfer.Target{{DecodeTP: 0, NumHeads: 4}, {DecodeTP: 1, Dummy: true}}, 1, 0, nil, 8 * item, 88, 0},
		{"PP stage 0 of 2: its layers, the marker", two, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 2, 0, nil, 4 * item, 8, 0},
		{"PP stage 1 of 2: its layers, the aux rows", two, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 2, 1, nil, 4 * item, 88, 0},
		{"draft buffers from the last stage", []*kvlayout.BufferLayout{kvLayout(item, 1, []int64{64})}, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 2, 1, nil, 6 * item, 8, 0},
		{"no draft buffers from stage 0", []*kvlayout.BufferLayout{kvLayout(item, 1, []int64{64})}, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 2, 0, nil, 4 * item, 8, 0},
		{"one Mamba slot per state buffer", []*kvlayout.BufferLayout{kvLayout(item, 0, []int64{64}, kvlayout.StateBuffer{Type: kvlayout.StateMamba, ItemLen: 100},
			kvlayout.StateBuffer{Type: kvlayout.StateMamba, ItemLen: 300})}, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 1, 0, mamba, 8 * item, 8, 400},
		{"every declared SWA page", []*kvlayout.BufferLayout{kvLayout(item, 0, []int64{64}, kvlayout.StateBuffer{Type: kvlayout.StateSWA, ItemLen: 1000})},
			[]transfer.Target{{DecodeTP: 0, NumHeads: 4}}, 1, 0, swa, 8 * item, 8, 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			page, aux, state := transfer.LayoutWeights(tc.engine, gqa, tc.targets, tc.pp, tc.ppRank, tc.state)
			if page != tc.page || aux != tc.aux || state != tc.stateLen {
				t.Fatalf("LayoutWeights = page %d, aux %d, state %d; want %d, %d, %d", page, aux, state, tc.page, tc.aux, tc.stateLen)
			}
			op := transfer.ChunkOp{Layout: gqa, Engine: tc.engine, Targets: tc.targets, PrefillPP: tc.pp, Rank: transfer.Rank{PP: tc.ppRank},
				DestPages: []int32{7, 8, 9}, Tokens: 40, State: tc.state}
			if got := transfer.ChunkBytes(op); got != 3*tc.page {
				t.Errorf("ChunkBytes of 3 pages (40 tokens) = %d, want whole pages: %d", got, 3*tc.page)
			}
			op.Last = true
			if got := transfer.ChunkBytes(op); got != 3*tc.page+tc.aux+tc.stateLen {
				t.Errorf("ChunkBytes of the last chunk = %d, want %d", got, 3*tc.page+tc.aux+tc.stateLen)
			}
		})
	}
}

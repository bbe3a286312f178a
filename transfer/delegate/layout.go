package delegate

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strings"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// The delegated path with an engine layout (transfer.ChunkOp.Engine): the
// decode engine's own buffers, registered with the agent in the memory the
// engine gave (RegisterLayout), and the chunk's copies computed from them
// as SGLang computes its own (see transfer.LayoutWeights for what moves).

// maxAgentName is the agent's bound on a buffer name.
const maxAgentName = 256

// layoutSpecs are the agent registrations of a layout's buffers.
func layoutSpecs(l *kvlayout.BufferLayout) []kvcopy.BufferSpec {
	if l == nil {
		return nil
	}
	out := make([]kvcopy.BufferSpec, 0, len(l.KV)+len(l.Aux)+len(l.State))
	for _, b := range l.KV {
		out = append(out, kvcopy.BufferSpec{Name: b.Name, Kind: kvcopy.KindKVPool, Length: b.Length, ItemSize: b.ItemLen, Memory: b.Memory})
	}
	for _, b := range l.Aux {
		out = append(out, kvcopy.BufferSpec{Name: b.Name, Kind: kvcopy.KindMetadata, Length: b.Length, ItemSize: b.RowLen, Memory: b.Memory})
	}
	for _, b := range l.State {
		out = append(out, kvcopy.BufferSpec{Name: b.Name, Kind: kvcopy.KindKVPool, Length: b.Length, ItemSize: b.ItemLen, Memory: b.Memory})
	}
	return out
}

// CheckOp implements transfer.OpChecker: with an engine layout, a chunk
// names the source its copies need.
func (e *DelegateEngine) CheckOp(op transfer.ChunkOp) error { return checkLayoutOp(op) }

// auxToCopy reports whether the op's last chunk copies aux rows (a rank of
// the last PP stage, a target whose layout has aux buffers besides the
// marker's) or state items.
func auxToCopy(op transfer.ChunkOp) (aux, state bool) {
	if !op.Last || !transfer.LastStage(op.PrefillPP, op.Rank.PP) {
		return false, false
	}
	for _, t := range op.Targets {
		if t.Dummy || t.DecodeTP < 0 || t.DecodeTP >= len(op.Engine) || op.Engine[t.DecodeTP] == nil {
			continue
		}
		el := op.Engine[t.DecodeTP]
		aux = aux || len(el.Aux) > 1
		state = state || len(el.State) > 0
	}
	return aux, state
}

// checkLayoutOp checks a chunk against its room's engine layouts; it
// returns a *transfer.FieldError naming the request field, or nil.
func checkLayoutOp(op transfer.ChunkOp) error {
	if len(op.Engine) == 0 {
		return nil
	}
	aux, state := auxToCopy(op)
	switch {
	case len(op.SrcPages) != len(op.DestPages):
		return invalid("source.page_indices", "has %d entries for %d pages: the delegated path needs one prefill page per destination page", len(op.SrcPages), len(op.DestPages))
	case !op.Last && op.SrcAuxRow >= 0:
		return invalid("source.aux_row", "is set on chunk %d, which is not the last: the aux rows travel with the last chunk", op.ChunkIndex)
	case !op.Last && len(op.SrcState) > 0:
		return invalid("source.state", "is set on chunk %d, which is not the last: the state travels with the last chunk", op.ChunkIndex)
	case op.Last && len(op.OutputIDs) > 0:
		return invalid("aux.output_ids", "has %d ids, but the decode engine registered its buffer layout: the first output ids travel in its aux buffers, copied from the prefill's aux row (source.aux_row); leave aux.output_ids empty", len(op.OutputIDs))
	case aux && op.SrcAuxRow < 0:
		return invalid("source.aux_row", "is required on the last chunk: the decode engine's layout has aux buffers, whose rows are copied from this prefill aux row (%s)", transfer.PrefillAuxName(prefixOrDots(op.SrcBuffer), 0))
	}
	if len(op.DestPages) > 0 || aux || state {
		if err := checkPrefix(op); err != nil {
			return err
		}
	}
	if state {
		return checkSrcState(op)
	}
	return nil
}

func prefixOrDots(p string) string {
	if p == "" {
		return "<source.buffer>"
	}
	return p
}

// checkPrefix checks the source prefix: given, its buffer names within the
// agent's bound, and none of them a decode buffer.
func checkPrefix(op transfer.ChunkOp) error {
	p := op.SrcBuffer
	switch {
	case p == "":
		return invalid("source.buffer", "is required on the delegated transfer path: the prefix of the prefill rank's buffers at the transfer agent (%s, %s, %s, ...)",
			transfer.PrefillKVName("<prefix>", kvlayout.KVBuffer{}), transfer.PrefillKVName("<prefix>", kvlayout.KVBuffer{Value: true}), transfer.PrefillAuxName("<prefix>", 0))
	case len(p)+len("/draft/k/4095") > maxAgentName:
		return invalid("source.buffer", "is %d bytes: with the decode engine's layout it is the prefix of the prefill buffers' names, at most %d bytes", len(p), maxAgentName-len("/draft/k/4095"))
	case strings.HasPrefix(p+"/", kvlayout.ReservedPrefix):
		return invalid("source.buffer", "%q names the decode side's own buffers: a chunk is copied from the prefill rank's buffers", p)
	}
	for _, el := range op.Engine {
		if el == nil {
			continue
		}
		for _, n := range el.Names() {
			if strings.HasPrefix(n, p+"/") {
				return invalid("source.buffer", "%q is the prefix of the decode engine's buffer %q: a chunk is copied from the prefill rank's buffers", p, n)
			}
		}
	}
	return nil
}

// checkSrcState checks source.state: for every state type the layout
// copies, exactly the items the room's last chunk moves.
func checkSrcState(op transfer.ChunkOp) error {
	for _, t := range stateTypes(op) {
		n := transfer.StateItems(t, op.State)
		got := -1
		for _, s := range op.SrcState {
			if s.Type != t {
				continue
			}
			got = len(s.Indices)
			for i, v := range s.Indices {
				if v < 0 {
					return invalid("source.state", "%s index [%d] = %d is negative", t, i, v)
				}
			}
		}
		if got != n && !(got < 0 && n == 0) {
			return invalid("source.state", "has %d %s indices: the decode engine's layout copies %d %s items with the last chunk (one Mamba slot; every declared SWA page), from the prefill's indices named here",
				max(got, 0), t, n, t)
		}
	}
	return nil
}

// stateTypes are the state types the op's targets' layouts hold.
func stateTypes(op transfer.ChunkOp) []kvlayout.StateType {
	var out []kvlayout.StateType
	for _, el := range op.Engine {
		if el == nil {
			continue
		}
		for _, s := range el.State {
			if !slices.Contains(out, s.Type) {
				out = append(out, s.Type)
			}
		}
	}
	return out
}

// indicesOf are the indices of state type t in s.
func indicesOf(s []kvlayout.StateIndices, t kvlayout.StateType) []int32 {
	for _, x := range s {
		if x.Type == t {
			return x.Indices
		}
	}
	return nil
}

// layoutBatch is TransferBatch with the room's engine layouts: per target,
// KV buffer and page one copy of the item (equal heads, MLA) or one strided
// copy of the head slice (page_size rows), consecutive pages merged; with
// the last chunk, the aux rows and state items (the last PP stage), then
// the marker as the batch's last write.
func layoutBatch(op transfer.ChunkOp, b kvcopy.Batch) (kvcopy.Batch, error) {
	if err := checkLayoutOp(op); err != nil {
		return b, err
	}
	if op.Last && op.Marker != 0 && op.MetadataSlot < 0 {
		return b, fmt.Errorf("metadata of room %d: the room has no metadata slot", op.Room)
	}
	l := op.Layout
	prefillHeads := max(1, l.TotalKVHeads/max(1, op.PrefillTP))
	auxRows, _ := auxToCopy(op)
	for _, t := range op.Targets {
		if t.Dummy {
			continue
		}
		if t.DecodeTP < 0 || t.DecodeTP >= len(op.Engine) || op.Engine[t.DecodeTP] == nil {
			return b, fmt.Errorf("decode tp %d of room %d has no engine layout", t.DecodeTP, op.Room)
		}
		el := op.Engine[t.DecodeTP]
		whole := l.IsMLA || (t.NumHeads == prefillHeads && prefillHeads == l.HeadsPerRank && t.SrcHeadStart == 0 && t.DstHeadStart == 0)
		for _, kb := range el.KV {
			if transfer.SendsKV(l, kb, op.PrefillPP, op.Rank.PP) {
				b.Copies = appendKV(b.Copies, op, t, kb, whole, prefillHeads)
			}
		}
		if !op.Last || !transfer.LastStage(op.PrefillPP, op.Rank.PP) {
			continue
		}
		if auxRows {
			for i, a := range el.Aux {
				if a.Name != el.Marker {
					b.Copies = append(b.Copies, kvcopy.Copy{SrcBuffer: transfer.PrefillAuxName(op.SrcBuffer, i), SrcOffset: int64(op.SrcAuxRow) * a.RowLen,
						DstBuffer: a.Name, DstOffset: int64(op.MetadataSlot) * a.RowLen, Length: a.RowLen})
				}
			}
		}
		if len(el.State) > 0 && !whole {
			return b, fmt.Errorf("room %d: the decode engine's layout has state buffers, which the delegated path copies whole only: prefill rank %d's heads are not decode tp %d's (prefill attn TP %d); run prefill and decode with the same attention TP",
				op.Room, op.Rank.TP, t.DecodeTP, op.PrefillTP)
		}
		for j, s := range el.State {
			n := transfer.StateItems(s.Type, op.State)
			src, dst := indicesOf(op.SrcState, s.Type), indicesOf(op.State, s.Type)
			for k := range n {
				b.Copies = append(b.Copies, kvcopy.Copy{SrcBuffer: transfer.PrefillStateName(op.SrcBuffer, j), SrcOffset: int64(src[k]) * s.ItemLen,
					DstBuffer: s.Name, DstOffset: int64(dst[k]) * s.ItemLen, Length: s.ItemLen})
			}
		}
	}
	if op.Last && op.Marker != 0 {
		for _, t := range op.Targets {
			if t.Dummy {
				continue
			}
			el := op.Engine[t.DecodeTP]
			m := el.Aux[el.MarkerIndex()]
			data := make([]byte, kvlayout.MarkerBytes)
			binary.LittleEndian.PutUint64(data, op.Marker)
			b.Writes = append(b.Writes, kvcopy.InlineWrite{DstBuffer: m.Name, DstOffset: int64(op.MetadataSlot) * m.RowLen, Data: data})
		}
	}
	return b, nil
}

// appendKV appends the copies of one KV buffer for the chunk's pages,
// merging a page into the previous copy when both sides continue it.
func appendKV(cs []kvcopy.Copy, op transfer.ChunkOp, t transfer.Target, kb kvlayout.KVBuffer, whole bool, prefillHeads int) []kvcopy.Copy {
	l := op.Layout
	src := transfer.PrefillKVName(op.SrcBuffer, kb)
	srcItem := kb.ItemLen
	if !l.IsMLA {
		srcItem = kb.ItemLen / int64(max(1, l.HeadsPerRank)) * int64(prefillHeads)
	}
	ps := int64(l.PageSize)
	start := len(cs)
	for i, dp := range op.DestPages {
		sp := int64(op.SrcPages[i])
		c := kvcopy.Copy{SrcBuffer: src, SrcOffset: sp * srcItem, DstBuffer: kb.Name, DstOffset: int64(dp) * kb.ItemLen, Length: kb.ItemLen}
		if !whole {
			hb := kb.ItemLen / (ps * int64(max(1, l.HeadsPerRank))) // one head of one token
			c.SrcOffset += int64(t.SrcHeadStart) * hb
			c.DstOffset += int64(t.DstHeadStart) * hb
			c.Length = int64(t.NumHeads) * hb
			c.Count = l.PageSize
			c.SrcStride, c.DstStride = srcItem/ps, kb.ItemLen/ps
		}
		if n := len(cs); n > start && merge(&cs[n-1], c) {
			continue
		}
		cs = append(cs, c)
	}
	return cs
}

// merge extends prev by c when c continues it on both sides: the next
// bytes of a contiguous copy, or the next rows of a strided one.
func merge(prev *kvcopy.Copy, c kvcopy.Copy) bool {
	if prev.Count == 0 {
		if c.Count != 0 || prev.SrcOffset+prev.Length != c.SrcOffset || prev.DstOffset+prev.Length != c.DstOffset {
			return false
		}
		prev.Length += c.Length
		return true
	}
	rows := int64(prev.Count)
	if c.Count == 0 || c.Length != prev.Length || c.SrcStride != prev.SrcStride || c.DstStride != prev.DstStride ||
		prev.SrcOffset+rows*prev.SrcStride != c.SrcOffset || prev.DstOffset+rows*prev.DstStride != c.DstOffset || prev.Count+c.Count > maxRows {
		return false
	}
	prev.Count += c.Count
	return true
}

// maxRows is the agent's bound on a copy's rows (2^24).
const maxRows = 1 << 24

package kvlayout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Validate checks the layout against the decode pool c describes (call it
// on a validated Config): every problem as an *Invalid naming the field
// (under "layout.") and the fix, joined. The rules:
//
//   - counts: 1..MaxLayoutKV KV buffers, 1..MaxLayoutAux aux buffers (the
//     marker's among them), at most MaxLayoutState state buffers;
//   - names: 1..MaxBufferName bytes of [A-Za-z0-9._/-], unique, not
//     beginning with ReservedPrefix (decodeplane's own buffers);
//   - the model's KV: for MHA/GQA (and the hybrids on them) exactly one K
//     and one V buffer per layer 0..num_layers-1, each of item_len
//     page_size × heads_per_rank × head_dim × dtype bytes; for MLA one
//     latent buffer per layer (value false) of page_size × (kv_lora_rank +
//     qk_rope_head_dim) × dtype bytes, plus the 132 DSA indexer-K bytes per
//     token for hybrid-MLA (as decodeplane's own layout keeps them);
//   - the draft model's KV (optional): the same per draft layer 0..D-1, one
//     item length for all of them, a whole number of bytes per token and
//     head (MHA/GQA: a multiple of page_size × heads_per_rank; MLA: of
//     page_size);
//   - aux: row_len 1..MaxAuxRow; the marker names one of them, whose row
//     holds at least the 8-byte marker;
//   - state: one type of the pool's kind each (MAMBA for hybrid-linear, SWA
//     for hybrid-swa; hybrid-MLA's DSA indexer is inside its KV items), at
//     least one buffer per such type, item_len 1..MaxItemLen, the MAMBA
//     items summing to kv_pool.mamba.state_bytes when it is set;
//   - lengths: every buffer holds what the pool can name: KV pages × item
//     (kv_pool's pages), metadata slots × row, and the state type's slots ×
//     item, at most MaxBufferLength.
func (l *BufferLayout) Validate(c Config) error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, Invalidf("layout."+field, format, args...))
	}
	switch {
	case len(l.KV) == 0 || len(l.KV) > MaxLayoutKV:
		add("kv", "has %d buffers (allowed 1..%d: one K and one V buffer per layer, or one latent buffer per layer for MLA)", len(l.KV), MaxLayoutKV)
	case len(l.Aux) == 0 || len(l.Aux) > MaxLayoutAux:
		add("aux", "has %d buffers (allowed 1..%d, the marker's among them)", len(l.Aux), MaxLayoutAux)
	case len(l.State) > MaxLayoutState:
		add("state", "has %d buffers (at most %d)", len(l.State), MaxLayoutState)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	l.checkNames(add)
	l.checkKV(c, add)
	l.checkAux(c, add)
	l.checkState(c, add)
	return errors.Join(errs...)
}

type addFunc func(field, format string, args ...any)

// CheckBufferName reports what is wrong with a buffer name, or "".
func CheckBufferName(name string) string {
	if len(name) == 0 || len(name) > MaxBufferName {
		return fmt.Sprintf("%q is %d bytes (allowed 1..%d)", name, len(name), MaxBufferName)
	}
	for i := range len(name) {
		ch := name[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '_' || ch == '/' || ch == '-') {
			return fmt.Sprintf("%q has byte %#02x at %d (allowed A-Z a-z 0-9 . _ / -)", name, ch, i)
		}
	}
	if strings.HasPrefix(name, ReservedPrefix) {
		return fmt.Sprintf("%q begins with %q, which names decodeplane's own buffers: name the engine's buffers otherwise (e.g. \"engine/dp0/tp0/k/0\")", name, ReservedPrefix)
	}
	return ""
}

func (l *BufferLayout) checkNames(add addFunc) {
	seen := map[string]string{}
	check := func(field, name string) {
		if p := CheckBufferName(name); p != "" {
			add(field, "%s", p)
			return
		}
		if prev, dup := seen[name]; dup {
			add(field, "%q is also %s: every buffer needs its own name", name, prev)
			return
		}
		seen[name] = "layout." + field
	}
	for i, b := range l.KV {
		check(fmt.Sprintf("kv[%d].name", i), b.Name)
	}
	for i, b := range l.Aux {
		check(fmt.Sprintf("aux[%d].name", i), b.Name)
	}
	for i, b := range l.State {
		check(fmt.Sprintf("state[%d].name", i), b.Name)
	}
}

// wantItemLen is a model KV buffer's item length on a decode rank.
func wantItemLen(lay Layout) int64 {
	if lay.IsMLA {
		return int64(lay.PageSize) * (lay.HeadBytes() + int64(lay.DSAIndexBytes))
	}
	return lay.ItemLen()
}

func (l *BufferLayout) checkKV(c Config, add addFunc) {
	lay := c.Layout()
	want := wantItemLen(lay)
	pages := lay.TotalPages
	var main, draft []int // per layer: K count, V count packed as k + v<<16
	draftItem := int64(-1)
	for i, b := range l.KV {
		f := fmt.Sprintf("kv[%d]", i)
		if lay.IsMLA && b.Value {
			add(f+".value", "is true, but %s keeps one latent buffer per layer: register it as the layer's K buffer (value false)", c.Pool.Kind.pool())
			continue
		}
		if b.Draft {
			if b.Layer < 0 || b.Layer >= MaxLayoutKV {
				add(f+".layer", "%d is not a draft layer (allowed 0..%d)", b.Layer, MaxLayoutKV-1)
				continue
			}
			draft = count(draft, b.Layer, b.Value)
			unit := int64(lay.PageSize) * int64(max(1, lay.HeadsPerRank))
			switch {
			case b.ItemLen <= 0 || b.ItemLen > MaxItemLen || b.ItemLen%unit != 0:
				add(f+".item_len", "%d is not a draft item: it must be a positive multiple of %d (page_size × heads per rank), at most %d", b.ItemLen, unit, int64(MaxItemLen))
			case draftItem >= 0 && b.ItemLen != draftItem:
				add(f+".item_len", "%d differs from the other draft buffers' %d: every draft buffer has the same item length", b.ItemLen, draftItem)
			default:
				draftItem = b.ItemLen
			}
		} else {
			if b.Layer < 0 || b.Layer >= lay.NumLayers {
				add(f+".layer", "%d is not a layer of the model (allowed 0..%d: kv_pool.num_layers is %d)", b.Layer, lay.NumLayers-1, lay.NumLayers)
				continue
			}
			main = count(main, b.Layer, b.Value)
			if b.ItemLen != want {
				add(f+".item_len", "%d is not one page of one layer of %s: want %d (%s)", b.ItemLen, c.Pool.Kind.pool(), want, itemLenFormula(lay))
			}
		}
		if need := mulCap(pages, b.ItemLen); b.ItemLen > 0 && (b.Length < need || b.Length > MaxBufferLength) {
			add(f+".length", "%d does not hold the pool's %d pages of %d bytes (allowed %d..%d)", b.Length, pages, b.ItemLen, need, int64(MaxBufferLength))
		}
	}
	checkLayers(add, "kv", main, lay.NumLayers, lay.IsMLA, false)
	checkLayers(add, "kv", draft, len(draft), lay.IsMLA, true)
}

func itemLenFormula(lay Layout) string {
	if lay.IsMLA {
		s := fmt.Sprintf("page_size %d × (kv_lora_rank + qk_rope_head_dim = %d) × %d dtype bytes", lay.PageSize, lay.HeadDim, lay.DTypeBytes)
		if lay.DSAIndexBytes > 0 {
			s += fmt.Sprintf(" + page_size × %d DSA indexer bytes", lay.DSAIndexBytes)
		}
		return s
	}
	return fmt.Sprintf("page_size %d × %d heads per rank × head_dim %d × %d dtype bytes", lay.PageSize, lay.HeadsPerRank, lay.HeadDim, lay.DTypeBytes)
}

// count records one buffer of layer (K or V) in a per-layer tally.
func count(t []int, layer int, value bool) []int {
	if layer >= len(t) {
		t = append(t, make([]int, layer+1-len(t))...)
	}
	if value {
		t[layer] += 1 << 16
	} else {
		t[layer]++
	}
	return t
}

// checkLayers checks a tally: exactly one K (and, without MLA, one V)
// buffer for each of n layers.
func checkLayers(add addFunc, field string, t []int, n int, mla, draft bool) {
	what := "layer"
	if draft {
		what = "draft layer"
	}
	wantV := 1
	if mla {
		wantV = 0
	}
	for layer := range n {
		k, v := 0, 0
		if layer < len(t) {
			k, v = t[layer]&0xffff, t[layer]>>16
		}
		if k == 1 && v == wantV {
			continue
		}
		if mla {
			add(field, "%s %d has %d latent buffers: want exactly one per %s", what, layer, k, what)
		} else {
			add(field, "%s %d has %d K and %d V buffers: want exactly one K and one V buffer per %s", what, layer, k, v, what)
		}
	}
}

func (l *BufferLayout) checkAux(c Config, add addFunc) {
	slots := int64(c.Pool.Metadata())
	for i, b := range l.Aux {
		f := fmt.Sprintf("aux[%d]", i)
		if b.RowLen <= 0 || b.RowLen > MaxAuxRow {
			add(f+".row_len", "%d is out of range (allowed 1..%d)", b.RowLen, MaxAuxRow)
			continue
		}
		if need := mulCap(slots, b.RowLen); b.Length < need || b.Length > MaxBufferLength {
			add(f+".length", "%d does not hold the %d metadata slots of %d bytes (allowed %d..%d; kv_pool.metadata_slots sizes them)", b.Length, slots, b.RowLen, need, int64(MaxBufferLength))
		}
	}
	switch i := l.MarkerIndex(); {
	case l.Marker == "":
		add("marker", "is required: name the aux buffer whose row begins with the room marker (SGLang's bootstrap_room column)")
	case i < 0:
		add("marker", "%q is not one of the aux buffers: name the aux buffer whose row begins with the room marker", l.Marker)
	case l.Aux[i].RowLen < MarkerBytes:
		add(fmt.Sprintf("aux[%d].row_len", i), "%d is too short for the marker buffer's row: the room marker takes %d bytes", l.Aux[i].RowLen, MarkerBytes)
	}
}

// stateSlots is how many items a state type's pool has.
func stateSlots(c Config, t StateType) int64 {
	p := c.Pool
	switch t {
	case StateMamba:
		return int64(p.Mamba.StateSlots)
	case StateSWA:
		return p.SWA.TotalTokens / int64(max(1, p.PageSize))
	}
	return p.Pages()
}

func (l *BufferLayout) checkState(c Config, add addFunc) {
	types := c.Pool.Kind.StateTypes()
	var mamba int64
	have := map[StateType]bool{}
	for i, b := range l.State {
		f := fmt.Sprintf("state[%d]", i)
		switch {
		case b.Type == StateDSA:
			add(f+".type", "DSA: hybrid-MLA's indexer-K bytes travel inside each KV item (see item_len): register no DSA state buffer")
			continue
		case !slices.Contains(types, b.Type):
			add(f+".type", "%s is not a state type of %s (its state types: %s)", b.Type, c.Pool.Kind.pool(), stateNames(types))
			continue
		case b.ItemLen <= 0 || b.ItemLen > MaxItemLen:
			add(f+".item_len", "%d is out of range (allowed 1..%d)", b.ItemLen, int64(MaxItemLen))
			continue
		}
		have[b.Type] = true
		if b.Type == StateMamba {
			mamba += b.ItemLen
		}
		n := stateSlots(c, b.Type)
		if need := mulCap(n, b.ItemLen); b.Length < need || b.Length > MaxBufferLength {
			add(f+".length", "%d does not hold the %d %s slots of %d bytes (allowed %d..%d)", b.Length, n, b.Type, b.ItemLen, need, int64(MaxBufferLength))
		}
	}
	for _, t := range types {
		if t != StateDSA && !have[t] {
			add("state", "has no %s buffer: %s sends its %s state with the last chunk; register its buffers", t, c.Pool.Kind.pool(), t)
		}
	}
	if sb := c.Pool.Mamba.StateBytes; have[StateMamba] && sb > 0 && mamba != sb {
		add("state", "MAMBA items sum to %d bytes, but kv_pool.mamba.state_bytes is %d: one request's state is the sum of its MAMBA buffers' items", mamba, sb)
	}
}

func stateNames(ts []StateType) string {
	if len(ts) == 0 {
		return "none"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return strings.Join(s, ", ")
}

// mulCap is a × b for sizes (a, b >= 0), capped above MaxBufferLength
// (no overflow).
func mulCap(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > (MaxBufferLength+1)/b {
		return MaxBufferLength + 1
	}
	return a * b
}

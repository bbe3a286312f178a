package kvlayout_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// pool is a small validated decode pool of kind k (TP 2: 4 of 8 KV heads,
// head_dim 16, bf16, page 16, 64 pages, 24 metadata slots).
func pool(t *testing.T, k kvlayout.Kind, f func(*kvlayout.Config)) kvlayout.Config {
	t.Helper()
	c := kvlayout.DefaultConfig()
	c.Pool.Kind, c.Pool.NumLayers, c.Pool.DType, c.Pool.PageSize = k, 2, "bf16", 16
	c.Pool.TotalTokens, c.Pool.TotalPages, c.Pool.RequestSlots, c.Pool.MetadataSlots = 0, 64, 8, 24
	c.Parallel.AttnTP = 2
	if k.IsMLA() {
		c.Pool.KVHeads, c.Pool.HeadDim, c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 0, 0, 32, 16
	} else {
		c.Pool.KVHeads, c.Pool.HeadDim = 8, 16
	}
	switch k {
	case kvlayout.KindHybridLinear:
		c.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 30, StateBytes: 3000}
	case kvlayout.KindHybridSWA:
		c.Pool.SWA = kvlayout.SWAConfig{Window: 64, TotalTokens: 512}
	}
	if f != nil {
		f(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("pool: %v", err)
	}
	return c
}

// sglangLayout is the layout SGLang registers for pool c: K buffers, then V
// buffers (MLA: latents), an output-ids column and the marker column, and
// the kind's state buffers.
func sglangLayout(c kvlayout.Config) *kvlayout.BufferLayout {
	lay := c.Layout()
	item := int64(lay.PageSize) * int64(lay.HeadsPerRank) * lay.HeadBytes()
	kvs := []string{"k", "v"}
	if lay.IsMLA {
		item, kvs = int64(lay.PageSize)*(lay.HeadBytes()+int64(lay.DSAIndexBytes)), []string{"k"}
	}
	l := &kvlayout.BufferLayout{Marker: "e/aux/room"}
	for i, n := range kvs {
		for layer := range lay.NumLayers {
			l.KV = append(l.KV, kvlayout.KVBuffer{Name: fmt.Sprintf("e/%s/%d", n, layer), Layer: layer, Value: i == 1, ItemLen: item, Length: lay.TotalPages * item})
		}
	}
	slots := int64(c.Pool.Metadata())
	l.Aux = []kvlayout.AuxBuffer{{Name: "e/aux/ids", RowLen: 64, Length: slots * 64}, {Name: "e/aux/room", RowLen: 64, Length: slots * 64}}
	switch c.Pool.Kind {
	case kvlayout.KindHybridLinear:
		l.State = []kvlayout.StateBuffer{{Name: "e/mamba/conv", Type: kvlayout.StateMamba, ItemLen: 1000, Length: 30 * 1000},
			{Name: "e/mamba/ssm", Type: kvlayout.StateMamba, ItemLen: 2000, Length: 30 * 2000}}
	case kvlayout.KindHybridSWA:
		l.State = []kvlayout.StateBuffer{{Name: "e/swa", Type: kvlayout.StateSWA, ItemLen: 4096, Length: 32 * 4096}}
	}
	return l
}

func TestBufferLayoutValidate(t *testing.T) {
	gqa := pool(t, kvlayout.KindGQA, nil)
	for _, k := range []kvlayout.Kind{kvlayout.KindMHA, kvlayout.KindGQA, kvlayout.KindMLA, kvlayout.KindHybridMLA, kvlayout.KindHybridLinear, kvlayout.KindHybridSWA} {
		c := pool(t, k, nil)
		if err := sglangLayout(c).Validate(c); err != nil {
			t.Errorf("SGLang's %s layout: %v", k, err)
		}
	}
	// Draft buffers: the draft model's K/V per draft layer, one item length.
	withDraft := sglangLayout(gqa)
	for i, n := range []string{"k", "v"} {
		withDraft.KV = append(withDraft.KV, kvlayout.KVBuffer{Name: "e/draft/" + n, Layer: 0, Value: i == 1, Draft: true, ItemLen: 64 * 4 * 10, Length: 64 * 64 * 4 * 10})
	}
	if err := withDraft.Validate(gqa); err != nil {
		t.Errorf("a layout with draft buffers: %v", err)
	}
	for _, tc := range []struct {
		name  string
		kind  kvlayout.Kind
		mut   func(*kvlayout.BufferLayout)
		field string
		says  string // in the message: the problem and its fix
	}{
		{"no KV", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV = nil }, "layout.kv", "allowed 1..4096"},
		{"no aux", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux = nil }, "layout.aux", "the marker's among them"},
		{"17 state buffers", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.State = make([]kvlayout.StateBuffer, 17) }, "layout.state", "at most 16"},
		{"empty name", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[1].Name = "" }, "layout.kv[1].name", "allowed 1..128"},
		{"129-byte name", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux[0].Name = strings.Repeat("a", 129) }, "layout.aux[0].name", "allowed 1..128"},
		{"name with ':'", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[0].Name = "e:k" }, "layout.kv[0].name", "allowed A-Z a-z 0-9 . _ / -"},
		{"decodeplane's prefix", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[0].Name = "decode/dp0/tp0/kv" }, "layout.kv[0].name", "names decodeplane's own buffers"},
		{"a name twice", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux[0].Name = l.KV[2].Name }, "layout.aux[0].name", "is also layout.kv[2].name"},
		{"a layer's V missing", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV = l.KV[:3] }, "layout.kv", "layer 1 has 1 K and 0 V buffers: want exactly one K and one V buffer per layer"},
		{"a layer's K twice", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[1].Layer = 0 }, "layout.kv", "layer 0 has 2 K and 1 V"},
		{"layer beyond the model", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[1].Layer = 2 }, "layout.kv[1].layer", "kv_pool.num_layers is 2"},
		{"TP 1's item", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[2].ItemLen *= 2 }, "layout.kv[2].item_len", "want 2048 (page_size 16 × 4 heads per rank × head_dim 16 × 2 dtype bytes)"},
		{"MLA value buffer", kvlayout.KindMLA, func(l *kvlayout.BufferLayout) { l.KV[1].Value = true }, "layout.kv[1].value", "one latent buffer per layer"},
		{"MLA without the rope", kvlayout.KindMLA, func(l *kvlayout.BufferLayout) { l.KV[0].ItemLen = 16 * 32 * 2 }, "layout.kv[0].item_len", "want 1536"},
		{"hybrid-MLA without the indexer", kvlayout.KindHybridMLA, func(l *kvlayout.BufferLayout) { l.KV[0].ItemLen = 16 * 48 * 2 }, "layout.kv[0].item_len", "132 DSA indexer bytes"},
		{"KV shorter than the pool", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.KV[0].Length-- }, "layout.kv[0].length", "does not hold the pool's 64 pages"},
		{"draft item of a partial head", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) {
			l.KV = append(l.KV, kvlayout.KVBuffer{Name: "e/dk", Draft: true, ItemLen: 100, Length: 6400}, kvlayout.KVBuffer{Name: "e/dv", Draft: true, Value: true, ItemLen: 100, Length: 6400})
		}, "layout.kv[4].item_len", "a positive multiple of 64"},
		{"draft layer without V", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) {
			l.KV = append(l.KV, kvlayout.KVBuffer{Name: "e/dk", Draft: true, ItemLen: 640, Length: 64 * 640})
		}, "layout.kv", "draft layer 0 has 1 K and 0 V"},
		{"draft items differ", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) {
			l.KV = append(l.KV, kvlayout.KVBuffer{Name: "e/dk", Draft: true, ItemLen: 640, Length: 64 * 640}, kvlayout.KVBuffer{Name: "e/dv", Draft: true, Value: true, ItemLen: 1280, Length: 64 * 1280})
		}, "layout.kv[5].item_len", "every draft buffer has the same item length"},
		{"row 0", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux[0].RowLen = 0 }, "layout.aux[0].row_len", "allowed 1..16777216"},
		{"aux shorter than the slots", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux[0].Length = 64 }, "layout.aux[0].length", "does not hold the 24 metadata slots"},
		{"no marker", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Marker = "" }, "layout.marker", "name the aux buffer whose row begins with the room marker"},
		{"marker not aux", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Marker = "e/k/0" }, "layout.marker", "is not one of the aux buffers"},
		{"marker row of 4 bytes", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) { l.Aux[1].RowLen, l.Aux[1].Length = 4, 96 }, "layout.aux[1].row_len", "the room marker takes 8 bytes"},
		{"state on GQA", kvlayout.KindGQA, func(l *kvlayout.BufferLayout) {
			l.State = []kvlayout.StateBuffer{{Name: "e/m", Type: kvlayout.StateMamba, ItemLen: 8, Length: 80}}
		}, "layout.state[0].type", "MAMBA is not a state type of a GQA pool (its state types: none)"},
		{"a DSA state buffer", kvlayout.KindHybridMLA, func(l *kvlayout.BufferLayout) {
			l.State = []kvlayout.StateBuffer{{Name: "e/dsa", Type: kvlayout.StateDSA, ItemLen: 8, Length: 8 * 64}}
		}, "layout.state[0].type", "inside each KV item"},
		{"Mamba missing", kvlayout.KindHybridLinear, func(l *kvlayout.BufferLayout) { l.State = nil }, "layout.state", "has no MAMBA buffer"},
		{"Mamba bytes differ", kvlayout.KindHybridLinear, func(l *kvlayout.BufferLayout) { l.State[1].ItemLen, l.State[1].Length = 2001, 60030 }, "layout.state", "kv_pool.mamba.state_bytes is 3000"},
		{"SWA shorter than its pool", kvlayout.KindHybridSWA, func(l *kvlayout.BufferLayout) { l.State[0].Length = 4096 }, "layout.state[0].length", "does not hold the 32 SWA slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := pool(t, tc.kind, nil)
			l := sglangLayout(c)
			tc.mut(l)
			err := l.Validate(c)
			var inv *kvlayout.Invalid
			if !errors.As(err, &inv) {
				t.Fatalf("Validate = %v; want an *Invalid naming %s", err, tc.field)
			}
			found := false
			for _, line := range strings.Split(err.Error(), "\n") {
				found = found || strings.HasPrefix(line, tc.field+": ") && strings.Contains(line, tc.says)
			}
			if !found {
				t.Errorf("Validate = %q; want a line naming %s that says %q", err, tc.field, tc.says)
			}
		})
	}
}

func TestBufferLayoutEqualAndID(t *testing.T) {
	c := pool(t, kvlayout.KindGQA, nil)
	a, b := sglangLayout(c), sglangLayout(c)
	if !a.Equal(b) || a.ID() != b.ID() || a.ID() == 0 {
		t.Fatalf("two identical layouts: Equal %v, IDs %x %x", a.Equal(b), a.ID(), b.ID())
	}
	b.KV[0].Memory = kvlayout.Memory{Kind: kvlayout.MemoryShared, Path: "/dev/shm/e", Offset: 4096}
	if a.Equal(b) || a.ID() != b.ID() {
		t.Errorf("another memory: Equal %v (want false), IDs %x %x (want equal: the id names the shape)", a.Equal(b), a.ID(), b.ID())
	}
	b = sglangLayout(c)
	b.Aux[0].RowLen, b.Aux[0].Length = 128, 128*24
	if a.Equal(b) || a.ID() == b.ID() {
		t.Errorf("another row length: Equal %v, IDs %x %x; want different", a.Equal(b), a.ID(), b.ID())
	}
	if !(*kvlayout.BufferLayout)(nil).Equal(nil) || a.Equal(nil) {
		t.Error("Equal with nil layouts")
	}
	if i := a.MarkerIndex(); i != 1 {
		t.Errorf("MarkerIndex = %d, want 1", i)
	}
}

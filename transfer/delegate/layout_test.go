package delegate_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// The delegated copies with the decode engine's layout, run on host
// memory: every prefill rank's chunk lands where SGLang's own transfer code
// would put it, and weighs what transfer.ChunkBytes says.

// layoutDecode is a GQA pool (4 layers, 8 KV heads × 16, bf16, page 16,
// 32 pages, 24 metadata slots) at decode TP tp, or its MLA twin.
func layoutDecode(t *testing.T, tp int, kind kvlayout.Kind) kvlayout.Config {
	t.Helper()
	dec := stgDecode(tp)
	dec.Staging = kvlayout.StagingConfig{}
	dec.Pool.TotalPages, dec.Pool.MetadataSlots, dec.Pool.Kind = 32, 24, kind
	if kind.IsMLA() {
		dec.Pool.KVHeads, dec.Pool.HeadDim, dec.Pool.KVLoraRank, dec.Pool.QKRopeHeadDim = 0, 0, 32, 16
	}
	if err := dec.Validate(); err != nil {
		t.Fatal(err)
	}
	return dec
}

const auxRow = 32 // every aux column's row

// engineLayouts are the engine's layouts of every decode TP rank: K then
// V buffers (MLA: latents), an output-ids column and the marker column.
func engineLayouts(dec kvlayout.Config) []*kvlayout.BufferLayout {
	lay := dec.Layout()
	item := lay.ItemLen()
	kvs := []string{"k", "v"}
	if lay.IsMLA {
		item, kvs = int64(lay.PageSize)*lay.HeadBytes(), []string{"k"}
	}
	var out []*kvlayout.BufferLayout
	for tp := range lay.AttnTP {
		l := &kvlayout.BufferLayout{Marker: fmt.Sprintf("e%d/room", tp)}
		for i, n := range kvs {
			for layer := range lay.NumLayers {
				l.KV = append(l.KV, kvlayout.KVBuffer{Name: fmt.Sprintf("e%d/%s/%d", tp, n, layer), Layer: layer, Value: i == 1, ItemLen: item, Length: lay.TotalPages * item})
			}
		}
		slots := int64(dec.Pool.Metadata())
		l.Aux = []kvlayout.AuxBuffer{{Name: fmt.Sprintf("e%d/ids", tp), RowLen: auxRow, Length: slots * auxRow}, {Name: l.Marker, RowLen: auxRow, Length: slots * auxRow}}
		if err := l.Validate(dec); err != nil {
			panic(err)
		}
		out = append(out, l)
	}
	return out
}

// headTargets are prefill rank r's decode targets by head ranges (TP sizes
// within the head count): the heads both hold.
func headTargets(l kvlayout.Layout, ptp, r int) []transfer.Target {
	if l.IsMLA {
		return []transfer.Target{{DecodeTP: 0}}
	}
	ph, dh := max(1, l.TotalKVHeads/ptp), l.HeadsPerRank
	var out []transfer.Target
	for e := range l.AttnTP {
		lo, hi := max(r*ph, e*dh), min((r+1)*ph, (e+1)*dh)
		if lo < hi {
			out = append(out, transfer.Target{DecodeTP: e, SrcHeadStart: lo - r*ph, DstHeadStart: lo - e*dh, NumHeads: hi - lo})
		}
	}
	return out
}

// tokenRow is token s's row of one layer buffer over heads [h0, h0+n)
// (MLA: the latent row).
func tokenRow(l kvlayout.Layout, layer, kv, token, h0, n int) []byte {
	hb := int(l.HeadBytes())
	if l.IsMLA {
		n = 1
	}
	out := make([]byte, n*hb)
	for h := range n {
		for b := range hb {
			out[h*hb+b] = pat(layer, kv, token, h0+h, b)
		}
	}
	return out
}

func TestLayoutBatchBytes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		dtp, ptp   int
		pp         int
		kind       kvlayout.Kind
		wantCopies int // per rank and buffer (0: not checked)
	}{
		{name: "equal TP 2", dtp: 2, ptp: 2, pp: 1, kind: kvlayout.KindGQA, wantCopies: 2},
		{name: "prefill TP 2 to decode TP 1", dtp: 1, ptp: 2, pp: 1, kind: kvlayout.KindGQA, wantCopies: 2},
		{name: "prefill TP 1 to decode TP 2", dtp: 2, ptp: 1, pp: 1, kind: kvlayout.KindGQA},
		{name: "prefill TP 4 to decode TP 2", dtp: 2, ptp: 4, pp: 1, kind: kvlayout.KindGQA},
		{name: "prefill PP 2", dtp: 1, ptp: 1, pp: 2, kind: kvlayout.KindGQA},
		{name: "MLA", dtp: 1, ptp: 1, pp: 1, kind: kvlayout.KindMLA, wantCopies: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := layoutDecode(t, tc.dtp, tc.kind)
			l, els := dec.Layout(), engineLayouts(dec)
			st := hostmem.New(0)
			for _, el := range els {
				if _, err := st.Register(layoutSpecs(el)); err != nil {
					t.Fatal(err)
				}
			}
			// Decode pages 4, 5 (consecutive: merged) and 9; the prefill's
			// 20, 21, 22. Metadata row 3, the prefill's aux row 7.
			dst, src, n := []int32{4, 5, 9}, []int32{20, 21, 22}, 3
			const room, slot, prow = 77, 3, 7
			prefillHeads := max(1, l.TotalKVHeads/tc.ptp)
			for pr := range tc.pp {
				for r := range tc.ptp {
					prefix := fmt.Sprintf("p/%d.%d", pr, r)
					fillLayoutPrefill(t, st, l, els[0], prefix, r, prefillHeads, tc.pp, pr, src, n)
					op := transfer.ChunkOp{Room: room, Rank: transfer.Rank{TP: r, PP: pr}, DestPages: dst, SrcPages: src, Tokens: n * l.PageSize,
						SrcBuffer: prefix, SrcAuxRow: prow, Targets: headTargets(l, tc.ptp, r), Layout: l, PrefillTP: tc.ptp, PrefillPP: tc.pp,
						Last: true, MetadataSlot: slot, Marker: room, Engine: els}
					b, err := delegate.TransferBatch(op)
					if err != nil {
						t.Fatal(err)
					}
					if got, want := b.Bytes(), transfer.ChunkBytes(op); got != want {
						t.Errorf("rank %d.%d: the batch moves %d bytes, ChunkBytes says %d", pr, r, got, want)
					}
					if tc.wantCopies > 0 {
						first := transfer.PrefillKVName(prefix, els[0].KV[0])
						got := 0
						for _, c := range b.Copies {
							if c.SrcBuffer == first {
								got++
							}
						}
						if got != tc.wantCopies {
							t.Errorf("rank %d: %d copies of %s, want %d (pages 4 and 5 merged)", r, got, first, tc.wantCopies)
						}
					}
					if w := b.Writes; len(w) != len(op.Targets) || len(w[len(w)-1].Data) != 8 || binary.LittleEndian.Uint64(w[len(w)-1].Data) != room {
						t.Errorf("rank %d: writes %v; want the marker once per target, last", r, w)
					}
					if _, err := st.Execute(context.Background(), b); err != nil {
						t.Fatal(err)
					}
				}
			}
			checkLayoutDecode(t, st, l, els, dst, n, slot, room)
		})
	}
}

// layoutSpecs registers a layout's buffers in agent memory.
func layoutSpecs(el *kvlayout.BufferLayout) []kvcopy.BufferSpec {
	var out []kvcopy.BufferSpec
	for _, b := range el.KV {
		out = append(out, kvcopy.BufferSpec{Name: b.Name, Kind: kvcopy.KindKVPool, Length: b.Length, ItemSize: b.ItemLen})
	}
	for _, a := range el.Aux {
		out = append(out, kvcopy.BufferSpec{Name: a.Name, Kind: kvcopy.KindMetadata, Length: a.Length, ItemSize: a.RowLen})
	}
	return out
}

// fillLayoutPrefill registers and fills prefill rank r's buffers (its PP
// stage's layers, its heads) for logical pages 0..n-1 at src, and its aux
// rows (the marker column's with junk).
func fillLayoutPrefill(t *testing.T, st *hostmem.Store, l kvlayout.Layout, el *kvlayout.BufferLayout, prefix string, r, heads, pp, pr int, src []int32, n int) {
	t.Helper()
	for _, b := range el.KV {
		if !transfer.SendsKV(l, b, pp, pr) {
			continue
		}
		item := b.ItemLen
		if !l.IsMLA {
			item = b.ItemLen / int64(l.HeadsPerRank) * int64(heads)
		}
		name := transfer.PrefillKVName(prefix, b)
		if _, err := st.Register([]kvcopy.BufferSpec{{Name: name, Kind: kvcopy.KindPrefillKV, Length: 64 * item}}); err != nil {
			t.Fatal(err)
		}
		kv := 0
		if b.Value {
			kv = 1
		}
		for i := range n {
			var page []byte
			for s := range l.PageSize {
				page = append(page, tokenRow(l, b.Layer, kv, i*l.PageSize+s, r*heads, heads)...)
			}
			if err := st.Write(name, int64(src[i])*item, page); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i, a := range el.Aux {
		name := transfer.PrefillAuxName(prefix, i)
		if _, err := st.Register([]kvcopy.BufferSpec{{Name: name, Kind: kvcopy.KindPrefillKV, Length: 16 * a.RowLen}}); err != nil {
			t.Fatal(err)
		}
		row := bytes.Repeat([]byte{byte(0x30 + i)}, int(a.RowLen))
		if a.Name == el.Marker {
			row = bytes.Repeat([]byte{0x5a}, int(a.RowLen))
		}
		if err := st.Write(name, 7*a.RowLen, row); err != nil {
			t.Fatal(err)
		}
	}
}

// checkLayoutDecode reads every decode rank's pages, aux rows and marker.
func checkLayoutDecode(t *testing.T, st *hostmem.Store, l kvlayout.Layout, els []*kvlayout.BufferLayout, dst []int32, n, slot int, room uint64) {
	t.Helper()
	for e, el := range els {
		for _, b := range el.KV {
			kv := 0
			if b.Value {
				kv = 1
			}
			for i := range n {
				got, err := st.Read(b.Name, int64(dst[i])*b.ItemLen, b.ItemLen)
				if err != nil {
					t.Fatal(err)
				}
				var want []byte
				for s := range l.PageSize {
					want = append(want, tokenRow(l, b.Layer, kv, i*l.PageSize+s, e*l.HeadsPerRank, l.HeadsPerRank)...)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("decode tp %d %s page %d (logical %d) differs", e, b.Name, dst[i], i)
				}
			}
		}
		ids, _ := st.Read(el.Aux[0].Name, int64(slot)*auxRow, auxRow)
		marker, _ := st.Read(el.Marker, int64(slot)*auxRow, auxRow)
		if !bytes.Equal(ids, bytes.Repeat([]byte{0x30}, auxRow)) || binary.LittleEndian.Uint64(marker) != room || !bytes.Equal(marker[8:], make([]byte, auxRow-8)) {
			t.Fatalf("decode tp %d row %d: ids %x, marker row %x; want the prefill's ids row, the marker, the rest of its row untouched", e, slot, ids, marker)
		}
	}
}

// TestLayoutOpChecks: the chunk source a layout's copies need, refused
// before the room records the chunk, naming the field.
func TestLayoutOpChecks(t *testing.T) {
	dec := layoutDecode(t, 1, kvlayout.KindGQA)
	l, els := dec.Layout(), engineLayouts(dec)
	good := func() transfer.ChunkOp {
		return transfer.ChunkOp{Room: 5, DestPages: []int32{1}, SrcPages: []int32{2}, SrcBuffer: "p", SrcAuxRow: 3, Targets: headTargets(l, 1, 0),
			Layout: l, PrefillTP: 1, PrefillPP: 1, Last: true, MetadataSlot: 1, Marker: 5, Engine: els}
	}
	e := delegate.NewDelegateEngine(delegate.DelegateConfig{}, hostmem.NewAgent(hostmem.New(0)), delegate.DelegateDeps{Logger: quiet})
	if err := e.CheckOp(good()); err != nil {
		t.Fatalf("a good chunk: %v", err)
	}
	for _, tc := range []struct {
		name  string
		mut   func(*transfer.ChunkOp)
		field string
		says  string
	}{
		{"no aux row", func(op *transfer.ChunkOp) { op.SrcAuxRow = -1 }, "source.aux_row", "is required on the last chunk"},
		{"aux row before the last chunk", func(op *transfer.ChunkOp) { op.Last, op.Marker = false, 0 }, "source.aux_row", "which is not the last"},
		{"output ids", func(op *transfer.ChunkOp) { op.OutputIDs = []int32{1} }, "aux.output_ids", "leave aux.output_ids empty"},
		{"state before the last chunk", func(op *transfer.ChunkOp) {
			op.Last, op.SrcAuxRow, op.SrcState = false, -1, []kvlayout.StateIndices{{Type: kvlayout.StateMamba, Indices: []int32{1}}}
		}, "source.state", "which is not the last"},
		{"no prefix", func(op *transfer.ChunkOp) { op.SrcBuffer = "" }, "source.buffer", "is required"},
		{"decode's own prefix", func(op *transfer.ChunkOp) { op.SrcBuffer = "decode/dp0" }, "source.buffer", "decode side's own buffers"},
		{"the engine's prefix", func(op *transfer.ChunkOp) { op.SrcBuffer = "e0" }, "source.buffer", `is the prefix of the decode engine's buffer "e0/k/0"`},
		{"a prefix too long", func(op *transfer.ChunkOp) { op.SrcBuffer = strings.Repeat("p", 244) }, "source.buffer", "at most 243 bytes"},
		{"source pages", func(op *transfer.ChunkOp) { op.SrcPages = nil }, "source.page_indices", "has 0 entries for 1 pages"},
	} {
		op := good()
		tc.mut(&op)
		err := e.CheckOp(op)
		var fe *transfer.FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.says) {
			t.Errorf("%s: %v; want %s refused saying %q", tc.name, err, tc.field, tc.says)
		}
		if _, err := delegate.TransferBatch(op); err == nil {
			t.Errorf("%s: TransferBatch built the batch", tc.name)
		}
	}
	// Without a layout, nothing of this applies.
	op := good()
	op.Engine, op.OutputIDs = nil, []int32{1}
	if err := e.CheckOp(op); err != nil {
		t.Errorf("a room without layouts: %v", err)
	}
}

// TestLayoutStateCopies: a hybrid-linear layout's Mamba buffers get one
// item each, the room's main slot, from the prefill's slot named in
// source.state; without it the chunk is refused; with other heads on the
// two sides the batch says why it cannot copy the state.
func TestLayoutStateCopies(t *testing.T) {
	dec := layoutDecode(t, 1, kvlayout.KindGQA)
	dec.Pool.Kind, dec.Pool.Mamba = kvlayout.KindHybridLinear, kvlayout.MambaConfig{StateSlots: 40, StateBytes: 96}
	if err := dec.Validate(); err != nil {
		t.Fatal(err)
	}
	l := dec.Layout()
	el := engineLayouts(layoutDecode(t, 1, kvlayout.KindGQA))[0]
	el.State = []kvlayout.StateBuffer{{Name: "e0/conv", Type: kvlayout.StateMamba, ItemLen: 32, Length: 40 * 32}, {Name: "e0/ssm", Type: kvlayout.StateMamba, ItemLen: 64, Length: 40 * 64}}
	if err := el.Validate(dec); err != nil {
		t.Fatal(err)
	}
	op := transfer.ChunkOp{Room: 9, SrcBuffer: "p", SrcAuxRow: 1, Targets: headTargets(l, 1, 0), Layout: l, PrefillTP: 1, PrefillPP: 1, Last: true,
		MetadataSlot: 2, Marker: 9, Engine: []*kvlayout.BufferLayout{el},
		State:    []kvlayout.StateIndices{{Type: kvlayout.StateMamba, Indices: []int32{5, 6}}},
		SrcState: []kvlayout.StateIndices{{Type: kvlayout.StateMamba, Indices: []int32{2}}}}
	b, err := delegate.TransferBatch(op)
	if err != nil {
		t.Fatal(err)
	}
	var state []kvcopy.Copy
	for _, c := range b.Copies {
		if strings.HasPrefix(c.SrcBuffer, "p/state/") {
			state = append(state, c)
		}
	}
	want := []kvcopy.Copy{{SrcBuffer: "p/state/0", SrcOffset: 2 * 32, DstBuffer: "e0/conv", DstOffset: 5 * 32, Length: 32},
		{SrcBuffer: "p/state/1", SrcOffset: 2 * 64, DstBuffer: "e0/ssm", DstOffset: 5 * 64, Length: 64}}
	if fmt.Sprint(state) != fmt.Sprint(want) {
		t.Errorf("state copies = %v, want %v", state, want)
	}
	if got, w := b.Bytes(), transfer.ChunkBytes(op); got != w || w != 8+auxRow+96 {
		t.Errorf("the last chunk moves %d bytes, ChunkBytes %d; want the marker, one aux row and one Mamba slot (%d)", got, w, 8+auxRow+96)
	}
	bad := op
	bad.SrcState = nil
	var fe *transfer.FieldError
	if err := checkOp(bad); !errors.As(err, &fe) || fe.Field != "source.state" {
		t.Errorf("no source.state = %v; want source.state refused", err)
	}
	bad = op
	bad.PrefillTP, bad.Targets = 2, []transfer.Target{{DecodeTP: 0, NumHeads: 4}}
	if _, err := delegate.TransferBatch(bad); err == nil || !strings.Contains(err.Error(), "copies whole only") {
		t.Errorf("state with other heads on each side = %v; want the batch refused saying why", err)
	}
}

func checkOp(op transfer.ChunkOp) error {
	return delegate.NewDelegateEngine(delegate.DelegateConfig{}, hostmem.NewAgent(hostmem.New(0)), delegate.DelegateDeps{Logger: quiet}).CheckOp(op)
}

// swappable is an agent that can be replaced under the engine: a
// restarted agent, whose memory is new.
type swappable struct {
	mu sync.Mutex
	a  *hostmem.Agent
}

func (s *swappable) get() *hostmem.Agent { s.mu.Lock(); defer s.mu.Unlock(); return s.a }
func (s *swappable) RegisterBuffers(ctx context.Context, b []kvcopy.BufferSpec) error {
	return s.get().RegisterBuffers(ctx, b)
}
func (s *swappable) DeregisterBuffers(ctx context.Context, n []string) error {
	return s.get().DeregisterBuffers(ctx, n)
}
func (s *swappable) Execute(ctx context.Context, b kvcopy.Batch) error {
	return s.get().Execute(ctx, b)
}
func (s *swappable) CancelRoom(ctx context.Context, r uint64) error {
	return s.get().CancelRoom(ctx, r)
}
func (s *swappable) Check(ctx context.Context) error { return s.get().Check(ctx) }

// TestRegisterLayoutReRegisters: the engine's buffers are registered with
// the agent in the memory the engine gave, refused all or nothing, and
// registered again by the health check after the agent restarted.
func TestRegisterLayoutReRegisters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dec := layoutDecode(t, 1, kvlayout.KindGQA)
		el := engineLayouts(dec)[0]
		ag := &swappable{a: hostmem.NewAgent(hostmem.New(0))}
		rd := newReadiness()
		eng := delegate.NewDelegateEngine(delegate.DelegateConfig{Target: "agent", BatchTimeout: time.Second, HealthInterval: time.Second}, ag,
			delegate.DelegateDeps{Buffers: kvcopy.DecodeBuffers(dec.Layout(), 0, 24), OnReadiness: rd.on, Logger: quiet})
		if _, err := eng.RegisterLayout(context.Background(), 0, 0, el); !errors.Is(err, transfer.ErrEngineUnavailable) {
			t.Fatalf("RegisterLayout before the agent was checked = %v; want ErrEngineUnavailable", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = eng.Run(ctx) }()
		<-rd.ch
		// GPU memory the reference agent does not hold: refused, nothing
		// registered.
		gpu := *el
		gpu.KV = append([]kvlayout.KVBuffer(nil), el.KV...)
		gpu.KV[1].Memory = kvlayout.Memory{Kind: kvlayout.MemoryCudaIPC, Handle: make([]byte, 64)}
		if _, err := eng.RegisterLayout(context.Background(), 0, 0, &gpu); err == nil || !strings.Contains(err.Error(), "cuda_ipc") {
			t.Fatalf("RegisterLayout in CUDA IPC memory = %v; want the agent's refusal", err)
		}
		if _, err := ag.get().Store().Read(el.KV[0].Name, 0, 1); err == nil {
			t.Fatal("a buffer of the refused layout was registered")
		}
		if _, err := eng.RegisterLayout(context.Background(), 0, 0, el); err != nil {
			t.Fatal(err)
		}
		ag.mu.Lock()
		ag.a = hostmem.NewAgent(hostmem.New(0)) // the agent restarts: its memory is new
		ag.mu.Unlock()
		time.Sleep(time.Second)
		synctest.Wait()
		for _, n := range append(el.Names(), kvcopy.DecodeKVName(0, 0)) {
			if _, err := ag.get().Store().Read(n, 0, 1); err != nil {
				t.Errorf("after the agent restarted, %s is not registered again: %v", n, err)
			}
		}
	})
}

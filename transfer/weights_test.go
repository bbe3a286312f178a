package transfer_test

import (
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer"
)

// layoutOf derives a validated decode layout.
func layoutOf(t *testing.T, f func(*kvlayout.Config)) kvlayout.Layout {
	t.Helper()
	c := kvlayout.DefaultConfig()
	if f != nil {
		f(&c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	return c.Layout()
}

// mlaDecode turns the decode pool into a DeepSeek-style MLA pool.
func mlaDecode(kind kvlayout.Kind) func(*kvlayout.Config) {
	return func(c *kvlayout.Config) {
		c.Pool.Kind = kind
		c.Pool.KVHeads, c.Pool.HeadDim = 0, 0
		c.Pool.KVLoraRank, c.Pool.QKRopeHeadDim = 512, 64
	}
}

func TestChunkBytes(t *testing.T) {
	gqa := layoutOf(t, nil) // 32 layers, 8 KV heads × 128, bf16, TP 1
	gqaTP4 := layoutOf(t, func(c *kvlayout.Config) { c.Parallel.AttnTP = 4 })
	mla := layoutOf(t, mlaDecode(kvlayout.KindMLA))
	hybridMLA := layoutOf(t, mlaDecode(kvlayout.KindHybridMLA))
	hybridLinear := layoutOf(t, func(c *kvlayout.Config) {
		c.Pool.Kind = kvlayout.KindHybridLinear
		c.Pool.Mamba = kvlayout.MambaConfig{StateSlots: 1024, StateBytes: 3 << 20}
	})
	tests := []struct {
		name string
		op   transfer.ChunkOp
		want int64
	}{
		{
			// 64 tokens × 2 (K, V) × 8 heads × 128 × 2 B × 32 layers.
			name: "MHA/GQA full heads", op: transfer.ChunkOp{Layout: gqa, Tokens: 64, Targets: []transfer.Target{{NumHeads: 8}}},
			want: 64 * 2 * 8 * 128 * 2 * 32,
		},
		{
			// Targets without a head count default to heads_per_rank (2 at TP 4).
			name: "GQA heads per rank", op: transfer.ChunkOp{Layout: gqaTP4, Tokens: 64, Targets: []transfer.Target{{}}},
			want: 64 * 2 * 2 * 128 * 2 * 32,
		},
		{
			// Prefill TP 1 → decode TP 4: four targets of 2 heads each.
			name: "GQA one prefill rank to four decode ranks", op: transfer.ChunkOp{Layout: gqaTP4, Tokens: 10, Targets: []transfer.Target{{NumHeads: 2}, {NumHeads: 2}, {NumHeads: 2}, {NumHeads: 2}}},
			want: 4 * 10 * 2 * 2 * 128 * 2 * 32,
		},
		{
			// A head slice of prefill TP 2 → decode TP 1: 4 of 8 heads.
			name: "GQA head slice", op: transfer.ChunkOp{Layout: gqa, Tokens: 100, Targets: []transfer.Target{{NumHeads: 4, DstHeadStart: 4}}},
			want: 100 * 2 * 4 * 128 * 2 * 32,
		},
		{name: "dummy target moves nothing", op: transfer.ChunkOp{Layout: gqa, Tokens: 64, Targets: []transfer.Target{{Dummy: true}}}, want: 0},
		{name: "no targets", op: transfer.ChunkOp{Layout: gqa, Tokens: 64}, want: 0},
		{
			// 64 tokens × (512 + 64) × 2 B × 32 layers; heads do not apply.
			name: "MLA", op: transfer.ChunkOp{Layout: mla, Tokens: 64, Targets: []transfer.Target{{NumHeads: 99}}},
			want: 64 * 576 * 2 * 32,
		},
		{
			// MLA plus 132 B of DSA indexer-K per token and layer.
			name: "hybrid MLA", op: transfer.ChunkOp{Layout: hybridMLA, Tokens: 64, Targets: []transfer.Target{{}}},
			want: 64 * (576*2 + 132) * 32,
		},
		{
			// Non-last chunk of hybrid-linear: KV only.
			name: "hybrid linear chunk", op: transfer.ChunkOp{Layout: hybridLinear, Tokens: 64, Targets: []transfer.Target{{NumHeads: 8}}},
			want: 64 * 2 * 8 * 128 * 2 * 32,
		},
		{
			// The last chunk carries the Mamba state (3 MiB).
			name: "hybrid linear last chunk", op: transfer.ChunkOp{Layout: hybridLinear, Tokens: 64, Last: true, Targets: []transfer.Target{{NumHeads: 8}}},
			want: 64*2*8*128*2*32 + 3<<20,
		},
		{name: "hybrid linear last chunk to a dummy", op: transfer.ChunkOp{Layout: hybridLinear, Tokens: 64, Last: true, Targets: []transfer.Target{{Dummy: true}}}, want: 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := transfer.ChunkBytes(tc.op); got != tc.want {
				t.Errorf("transfer.ChunkBytes() = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestStageLayers(t *testing.T) {
	if b, e := transfer.StageLayers(61, 4, 3); b != 45 || e != 61 {
		t.Errorf("StageLayers(61, 4, 3) = [%d, %d), want [45, 61)", b, e)
	}
}

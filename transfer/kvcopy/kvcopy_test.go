package kvcopy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

func TestKVOffsets(t *testing.T) {
	// 2 layers, 3 heads of 4 bytes, pages of 2 tokens: a page is
	// 2 × 2 × 2 × 3 × 4 = 96 bytes.
	g := kvcopy.KV{Layers: 2, Heads: 3, HeadBytes: 4, PageSize: 2}
	tests := []struct {
		page, layer, kv, token, head int
		want                         int64
	}{
		{0, 0, 0, 0, 0, 0},
		{0, 0, 0, 0, 2, 8},
		{0, 0, 0, 1, 0, 12},  // next token row
		{0, 0, 1, 0, 0, 24},  // V follows K
		{0, 1, 0, 0, 0, 48},  // next layer
		{1, 0, 0, 0, 0, 96},  // next page
		{3, 1, 1, 1, 2, 380}, // ((((3·2+1)·2+1)·2+1)·3+2)·4
	}
	for _, tc := range tests {
		if got := g.Offset(tc.page, tc.layer, tc.kv, tc.token, tc.head); got != tc.want {
			t.Errorf("Offset(%d, %d, %d, %d, %d) = %d, want %d", tc.page, tc.layer, tc.kv, tc.token, tc.head, got, tc.want)
		}
	}
	if g.PageBytes() != 96 {
		t.Errorf("PageBytes = %d, want 96", g.PageBytes())
	}
	m := kvcopy.KV{Layers: 3, RowBytes: 10, PageSize: 4, MLA: true}
	if got := m.RowOffset(2, 1, 3); got != ((2*3+1)*4+3)*10 {
		t.Errorf("MLA RowOffset(2, 1, 3) = %d", got)
	}
}

func TestMetadataSlot(t *testing.T) {
	b, err := kvcopy.EncodeMetadata(0x0102030405060708, []int32{7, -2})
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 64)
	copy(want, []byte{8, 7, 6, 5, 4, 3, 2, 1, 7, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff})
	if diff := cmp.Diff(want, b); diff != "" {
		t.Errorf("EncodeMetadata (-want +got):\n%s", diff)
	}
	marker, ids, err := kvcopy.DecodeMetadata(b)
	if err != nil || marker != 0x0102030405060708 || ids[0] != 7 || ids[1] != -2 || len(ids) != kvcopy.MaxOutputIDs {
		t.Errorf("DecodeMetadata = %x, %v, %v", marker, ids, err)
	}
	if _, err := kvcopy.EncodeMetadata(1, make([]int32, 15)); err == nil {
		t.Error("EncodeMetadata with 15 ids succeeded; a slot holds 14")
	}
}

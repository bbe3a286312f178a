package staging_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/kvmanager/staging"
)

// compute_staging_layout: writers = src_tp/dst_tp when larger, else 1;
// writer bytes = tokens × heads × bytes_per_head_token × layers × 2.
func TestComputeStagingLayout(t *testing.T) {
	tests := []struct {
		name                         string
		srcTP, dstTP, dstRank, heads int
		tokens, layers               int
		bpht                         int64
		want                         staging.ChunkLayout
	}{
		{
			name: "prefill TP 4 to decode TP 2", srcTP: 4, dstTP: 2, dstRank: 1, heads: 8, tokens: 64, layers: 4, bpht: 256,
			// 64 × 2 × 256 × 4 × 2 = 262144 per writer.
			want: staging.ChunkLayout{NumWriters: 2, WriterBytes: []int64{262144, 262144}, WriterOffsets: []int64{0, 262144}, Total: 524288},
		},
		{
			name: "prefill TP 2 to decode TP 4", srcTP: 2, dstTP: 4, dstRank: 3, heads: 8, tokens: 64, layers: 4, bpht: 256,
			want: staging.ChunkLayout{NumWriters: 1, WriterBytes: []int64{262144}, WriterOffsets: []int64{0}, Total: 262144},
		},
		{
			name: "prefill TP 8 to decode TP 1", srcTP: 8, dstTP: 1, dstRank: 0, heads: 8, tokens: 16, layers: 2, bpht: 256,
			// 16 × 1 × 256 × 2 × 2 = 16384 per writer, 8 writers.
			want: staging.ChunkLayout{NumWriters: 8,
				WriterBytes:   []int64{16384, 16384, 16384, 16384, 16384, 16384, 16384, 16384},
				WriterOffsets: []int64{0, 16384, 32768, 49152, 65536, 81920, 98304, 114688}, Total: 131072},
		},
		{
			name: "prefill TP 4 above 2 KV heads to decode TP 1", srcTP: 4, dstTP: 1, dstRank: 0, heads: 2, tokens: 16, layers: 2, bpht: 256,
			// Every writer carries its one (replicated) head.
			want: staging.ChunkLayout{NumWriters: 4, WriterBytes: []int64{16384, 16384, 16384, 16384}, WriterOffsets: []int64{0, 16384, 32768, 49152}, Total: 65536},
		},
		{
			name: "prefill TP 1 to decode TP 4 above 2 KV heads", srcTP: 1, dstTP: 4, dstRank: 2, heads: 2, tokens: 32, layers: 3, bpht: 128,
			// dst_per 1: 32 × 1 × 128 × 3 × 2 = 24576.
			want: staging.ChunkLayout{NumWriters: 1, WriterBytes: []int64{24576}, WriterOffsets: []int64{0}, Total: 24576},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := staging.ComputeLayout(tc.srcTP, tc.dstTP, tc.dstRank, tc.heads, tc.tokens, tc.bpht, tc.layers)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ComputeLayout(%d, %d, %d, %d, %d, %d, %d) mismatch (-want +got):\n%s", tc.srcTP, tc.dstTP, tc.dstRank, tc.heads, tc.tokens, tc.bpht, tc.layers, diff)
			}
		})
	}
}

func TestStagingRing(t *testing.T) {
	type region = staging.RingRegion
	ring := staging.NewRing(100)
	type wm struct{ round, tail int64 }
	watermark := func() wm { r, tl := ring.Watermark(); return wm{r, tl} }
	assign := func(n int64) region {
		t.Helper()
		r, err := ring.Assign(n)
		if err != nil {
			t.Fatalf("Assign(%d): %v", n, err)
		}
		return r
	}
	steps := []struct {
		name         string
		do           func() region
		want         region
		wantWritable bool
		wantWM       wm
	}{
		{"first fits", func() region { return assign(40) }, region{ID: 0, Offset: 0, Size: 40, Round: 0}, true, wm{0, 0}},
		{"second fits after it", func() region { return assign(40) }, region{ID: 1, Offset: 40, Size: 40, Round: 0}, true, wm{0, 0}},
		// 20 bytes left: a new round starts at 0, over the live first region.
		{"wraps into round 1", func() region { return assign(30) }, region{ID: 2, Offset: 0, Size: 30, Round: 1}, false, wm{0, 0}},
	}
	var regs []region
	for _, s := range steps {
		got := s.do()
		regs = append(regs, got)
		if got != s.want {
			t.Fatalf("%s: Assign = %+v, want %+v", s.name, got, s.want)
		}
		if w := ring.Writable(got); w != s.wantWritable {
			t.Errorf("%s: Writable(%+v) = %v, want %v", s.name, got, w, s.wantWritable)
		}
		if w := watermark(); w != s.wantWM {
			t.Errorf("%s: Watermark = %+v, want %+v", s.name, w, s.wantWM)
		}
	}
	// Freeing the first region moves the watermark to the oldest live one
	// (0, 40): round 1's [0, 30) is now clear of live data.
	if !ring.Free(regs[0].ID) {
		t.Fatal("Free(0) = false")
	}
	if w := watermark(); w != (wm{0, 40}) {
		t.Errorf("after Free(0): Watermark = %+v, want {0 40}", w)
	}
	if !ring.Writable(regs[2]) {
		t.Errorf("after Free(0): region %+v not writable", regs[2])
	}
	d := assign(20) // [30, 50) of round 1 overlaps live [40, 80) of round 0
	if d != (region{ID: 3, Offset: 30, Size: 20, Round: 1}) || ring.Writable(d) {
		t.Errorf("Assign(20) = %+v writable %v, want {3 30 20 1} not writable", d, ring.Writable(d))
	}
	if ring.Free(regs[0].ID) {
		t.Error("a second Free(0) = true, want false")
	}
	ring.Free(regs[1].ID) // round 0 is gone: watermark (1, 0)
	if w := watermark(); w != (wm{1, 0}) || !ring.Writable(d) {
		t.Errorf("after Free(1): Watermark = %+v, Writable(%+v) = %v; want {1 0}, true", w, d, ring.Writable(d))
	}
	ring.Free(regs[2].ID)
	ring.Free(d.ID)
	if w, live := watermark(), ring.Live(); w != (wm{1, 50}) || live != 0 {
		t.Errorf("all freed: Watermark = %+v, Live = %d; want {1 50}, 0", w, live)
	}
	// Nothing is live and 50 bytes are left: a 60-byte region starts round 2.
	// SGLang's stale watermark (1, 50) would never release it; the ring's is
	// the region itself, so it is writable at once.
	e := assign(60)
	if e != (region{ID: 4, Offset: 0, Size: 60, Round: 2}) || !ring.Writable(e) {
		t.Errorf("Assign(60) = %+v writable %v, want {4 0 60 2} writable", e, ring.Writable(e))
	}
	if _, err := ring.Assign(101); !errors.Is(err, staging.ErrTooLarge) {
		t.Errorf("Assign(101) error = %v, want ErrStagingTooLarge", err)
	}
	if _, err := ring.Assign(0); err == nil {
		t.Error("Assign(0) succeeded, want an error")
	}
	ring.Free(e.ID)
	if w := watermark(); w != (wm{2, 60}) {
		t.Errorf("Watermark = %+v, want {2 60}", w)
	}
}

func TestWatermarkReady(t *testing.T) {
	tests := []struct {
		wmRound, wmTail, round, end int64
		want                        bool
	}{
		{0, 0, 0, 100, true},  // round 0 has no earlier data
		{0, 0, 1, 10, false},  // round 0 data from offset 0 still live
		{0, 40, 1, 40, true},  // ends exactly at the tail
		{0, 40, 1, 41, false}, // one byte over
		{1, 0, 1, 90, true},   // the previous round is behind the watermark
		{1, 10, 3, 5, false},  // two rounds ahead
		{2, 0, 3, 100, false}, // previous round 2 is the watermark's, and it ends past tail 0
		{-1, 0, -1, 5, true},  // rounds <= 0 are always writable
	}
	for _, tc := range tests {
		got := staging.WatermarkReady(tc.wmRound, tc.wmTail, tc.round, tc.end)
		if got != tc.want {
			t.Errorf("WatermarkReady(wm (%d, %d), region round %d end %d) = %v, want %v", tc.wmRound, tc.wmTail, tc.round, tc.end, got, tc.want)
		}
	}
}

// FuzzStagingRing drives the ring with random assigns and frees and checks
// its invariants after every step: regions stay inside the ring; no two live
// writable regions overlap (the watermark never lets two writers collide);
// the oldest live region is always writable (no deadlock); freeing
// everything brings the watermark back to the head.
func FuzzStagingRing(f *testing.F) {
	f.Add(uint64(1), uint16(100), []byte{10, 200, 30, 140, 90, 7, 255, 3})
	f.Add(uint64(7), uint16(64), []byte{63, 64, 65, 1, 128, 129, 130, 2, 2, 2})
	f.Fuzz(func(t *testing.T, seed uint64, size uint16, ops []byte) {
		if size == 0 {
			return
		}
		ring := staging.NewRing(int64(size))
		rng := rand.New(rand.NewPCG(seed, seed>>1|1))
		var live []staging.RingRegion
		for i, op := range ops {
			if op >= 128 && len(live) > 0 {
				k := rng.IntN(len(live))
				if !ring.Free(live[k].ID) {
					t.Fatalf("step %d: Free(%d) = false for a live region", i, live[k].ID)
				}
				live = append(live[:k], live[k+1:]...)
			} else {
				n := int64(op%128) * int64(size) / 96 // sometimes larger than the ring
				r, err := ring.Assign(n)
				switch {
				case n <= 0:
					if err == nil {
						t.Fatalf("step %d: Assign(%d) succeeded", i, n)
					}
					continue
				case n > int64(size):
					if !errors.Is(err, staging.ErrTooLarge) {
						t.Fatalf("step %d: Assign(%d) on a %d-byte ring: err %v, want ErrStagingTooLarge", i, n, size, err)
					}
					continue
				case err != nil:
					t.Fatalf("step %d: Assign(%d): %v", i, n, err)
				}
				if r.Offset < 0 || r.End() > int64(size) || r.Size != n {
					t.Fatalf("step %d: Assign(%d) = %+v outside the %d-byte ring", i, n, r, size)
				}
				live = append(live, r)
			}
			if ring.Live() != len(live) {
				t.Fatalf("step %d: Live() = %d, want %d", i, ring.Live(), len(live))
			}
			for a := range live {
				for b := a + 1; b < len(live); b++ {
					ra, rb := live[a], live[b]
					if ring.Writable(ra) && ring.Writable(rb) && ra.Offset < rb.End() && rb.Offset < ra.End() {
						r, tl := ring.Watermark()
						t.Fatalf("step %d: live writable regions %+v and %+v overlap (watermark %d/%d)", i, ra, rb, r, tl)
					}
				}
			}
			if len(live) > 0 {
				oldest := live[0]
				for _, r := range live {
					if r.ID < oldest.ID {
						oldest = r
					}
				}
				if !ring.Writable(oldest) {
					r, tl := ring.Watermark()
					t.Fatalf("step %d: the oldest live region %+v is not writable (watermark %d/%d): the ring would deadlock", i, oldest, r, tl)
				}
			}
		}
		for _, r := range live {
			ring.Free(r.ID)
		}
		wr, wt := ring.Watermark()
		hr, h := ring.Head()
		if ring.Live() != 0 || wr != hr || wt != h {
			t.Fatalf("all freed: Live %d, watermark (%d, %d), head (%d, %d); want 0 and watermark == head", ring.Live(), wr, wt, hr, h)
		}
	})
}

// BenchmarkStagingRing is the allocator alone: a steady state of 8 live
// regions of varying size in a 4 MiB ring, one Assign and one Free per op
// (wraps every few operations).
func BenchmarkStagingRing(b *testing.B) {
	ring := staging.NewRing(4 << 20)
	sizes := []int64{256 << 10, 512 << 10, 128 << 10, 384 << 10}
	var live []uint64
	for i := range 8 {
		r, _ := ring.Assign(sizes[i%len(sizes)])
		live = append(live, r.ID)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		r, err := ring.Assign(sizes[i%len(sizes)])
		if err != nil {
			b.Fatal(err)
		}
		_ = ring.Writable(r)
		ring.Free(live[0])
		live = append(live[1:], r.ID)
	}
}

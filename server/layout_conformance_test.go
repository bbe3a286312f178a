package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The conformance rows of Rooms.RegisterEngineLayout and of the chunk
// source's layout fields, against a daemon whose decode engine owns its
// pages (kv_pool.owner: engine; GQA, 4 layers, 8 KV heads × 16, bf16, page
// 16, attn TP 2: 4 heads and a 2,048-byte item per decode rank). Every
// refusal leaves GetStatus (engine_layouts included) as it was.

// layoutConf is the conformance daemon's decode pool.
func layoutConf() kvlayout.Config {
	dec := stgDecodeConfig(2)
	dec.Staging = kvlayout.StagingConfig{PoolSizeMB: 1}
	dec.Pool.Owner = kvlayout.OwnerEngine
	return dec
}

// goodLayout is a valid layout of decode rank tp under layoutConf: K then
// V per layer, an output-ids column and the marker column.
func goodLayout(tp int) *pb.EngineLayout {
	dec := layoutConf()
	item := uint64(dec.Layout().ItemLen())
	pages := uint64(dec.Pool.Pages())
	slots := uint64(dec.Pool.Metadata())
	l := &pb.EngineLayout{Marker: fmt.Sprintf("eng/tp%d/aux/room", tp)}
	for kv, name := range []string{"k", "v"} {
		for layer := range dec.Pool.NumLayers {
			l.Kv = append(l.Kv, &pb.EngineKVBuffer{Name: fmt.Sprintf("eng/tp%d/%s/%d", tp, name, layer), Layer: uint32(layer), Value: kv == 1,
				ItemLen: item, Length: pages * item})
		}
	}
	l.Aux = []*pb.EngineAuxBuffer{{Name: fmt.Sprintf("eng/tp%d/aux/ids", tp), RowLen: 16, Length: slots * 16}, {Name: l.Marker, RowLen: 64, Length: slots * 64}}
	return l
}

func TestConformanceEngineLayout(t *testing.T) {
	dec := layoutConf()
	if err := dec.Validate(); err != nil {
		t.Fatal(err)
	}
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
	}})
	conn := d.Conn(t)
	rooms, admin := pb.NewRoomsClient(conn), pb.NewAdminClient(conn)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Decode tp 0's layout is registered: tp 1's may not reuse its names.
	first, err := rooms.RegisterEngineLayout(ctx, &pb.RegisterEngineLayoutRequest{Layout: goodLayout(0)})
	if err != nil || first.GetLayoutId() == 0 || first.GetAlready() {
		t.Fatalf("RegisterEngineLayout(tp 0) = %v, %v; want a layout id, not already", first, err)
	}
	again, err := rooms.RegisterEngineLayout(ctx, &pb.RegisterEngineLayoutRequest{Layout: goodLayout(0)})
	if err != nil || !again.GetAlready() || again.GetLayoutId() != first.GetLayoutId() {
		t.Fatalf("RegisterEngineLayout(tp 0) again = %v, %v; want already with the same id", again, err)
	}
	snapshot := func(ctx context.Context) string {
		st, err := admin.GetStatus(ctx, &pb.GetStatusRequest{})
		if err != nil {
			t.Fatalf("GetStatus: %v", err)
		}
		if len(st.GetEngineLayouts()) != 1 || st.GetEngineLayouts()[0].GetLayoutId() != first.GetLayoutId() {
			t.Fatalf("GetStatus.engine_layouts = %v; want tp 0's", st.GetEngineLayouts())
		}
		st.StartedAt, st.Uptime = nil, nil
		return prototext.Format(st)
	}
	runConformance(t, layoutRows(t, conn, rooms), snapshot)
}

// layoutRows are RegisterEngineLayout's bad inputs and the chunk source's.
func layoutRows(t *testing.T, conn *grpc.ClientConn, rooms pb.RoomsClient) []confRow {
	type req = pb.RegisterEngineLayoutRequest
	good := func() *req { return &req{DecodeTpRank: 1, Layout: goodLayout(1)} }
	reg := func(ctx context.Context, r *req) error { _, err := rooms.RegisterEngineLayout(ctx, r); return err }
	inv := codes.InvalidArgument
	shm := func(path string, off uint64) *pb.EngineMemory {
		return &pb.EngineMemory{Kind: &pb.EngineMemory_Shared{Shared: &pb.EngineSharedMemory{Path: path, Offset: off}}}
	}
	row := func(name string, mut func(*req), code codes.Code, field string) confRow {
		return unaryRow("RegisterEngineLayout "+name, good, mut, reg, code, field)
	}
	rows := []confRow{
		row("decode_dp_rank 1024", func(r *req) { r.DecodeDpRank = 1024 }, inv, "decode_dp_rank: 1024 is out of range"),
		row("decode_dp_rank beyond parallel.dp", func(r *req) { r.DecodeDpRank = 1 }, inv, "decode_dp_rank: 1 is out of range: this daemon hosts 1 decode DP shards"),
		row("decode_tp_rank beyond parallel.attn_tp", func(r *req) { r.DecodeTpRank = 2 }, inv, "decode_tp_rank: 2 is out of range: parallel.attn_tp is 2"),
		row("no layout", func(r *req) { r.Layout = nil }, inv, "layout: is required"),
		row("no kv", func(r *req) { r.Layout.Kv = nil }, inv, "layout.kv: has 0 buffers (allowed 1..4096)"),
		row("4,097 kv", func(r *req) { r.Layout.Kv = repeat(r.Layout.Kv[0], 4097) }, inv, "layout.kv: has 4097 buffers"),
		row("no aux", func(r *req) { r.Layout.Aux = nil }, inv, "layout.aux: has 0 buffers"),
		row("65 aux", func(r *req) { r.Layout.Aux = repeat(r.Layout.Aux[0], 65) }, inv, "layout.aux: has 65 buffers"),
		row("17 state", func(r *req) { r.Layout.State = repeat(&pb.EngineStateBuffer{}, 17) }, inv, "layout.state: has 17 buffers"),
		row("empty name", func(r *req) { r.Layout.Kv[3].Name = "" }, inv, "layout.kv[3].name: is 0 bytes"),
		row("129-byte name", func(r *req) { r.Layout.Kv[3].Name = strings.Repeat("n", 129) }, inv, "layout.kv[3].name: is 129 bytes"),
		row("name with a space", func(r *req) { r.Layout.Aux[0].Name = "eng/aux ids" }, inv, "layout.aux[0].name: has byte 0x20"),
		row("decodeplane's own name", func(r *req) { r.Layout.Kv[0].Name = "decode/dp0/tp1/kv" }, inv, `layout.kv[0].name: "decode/dp0/tp1/kv" begins with "decode/"`),
		row("a name twice", func(r *req) { r.Layout.Kv[1].Name = r.Layout.Kv[0].Name }, inv, "layout.kv[1].name"),
		row("another rank's name", func(r *req) { r.Layout.Kv[2].Name = "eng/tp0/k/2" }, inv, `layout.kv[2].name: "eng/tp0/k/2" is a buffer of decode rank (dp 0, tp 0)'s layout`),
		row("layer 4096", func(r *req) { r.Layout.Kv[0].Layer = 4096 }, inv, "layout.kv[0].layer: 4096 is out of range"),
		row("layer beyond num_layers", func(r *req) { r.Layout.Kv[0].Layer = 4 }, inv, "layout.kv[0].layer: 4 is not a layer of the model (allowed 0..3"),
		row("a layer's V missing", func(r *req) { r.Layout.Kv = r.Layout.Kv[:7] }, inv, "layout.kv: layer 3 has 1 K and 0 V buffers"),
		row("item_len 0", func(r *req) { r.Layout.Kv[0].ItemLen = 0 }, inv, "layout.kv[0].item_len: 0 is out of range"),
		row("item_len 2^40+1", func(r *req) { r.Layout.Kv[0].ItemLen = 1<<40 + 1 }, inv, "layout.kv[0].item_len"),
		row("item_len of TP 1", func(r *req) { r.Layout.Kv[5].ItemLen *= 2 }, inv, "layout.kv[5].item_len: 4096 is not one page of one layer of a GQA pool: want 2048 (page_size 16 × 4 heads per rank"),
		row("kv length below the pool", func(r *req) { r.Layout.Kv[0].Length = 4096 }, inv, "layout.kv[0].length: 4096 does not hold the pool's 512 pages"),
		row("length 2^62+1", func(r *req) { r.Layout.Kv[0].Length = 1<<62 + 1 }, inv, "layout.kv[0].length"),
		row("row_len 0", func(r *req) { r.Layout.Aux[0].RowLen = 0 }, inv, "layout.aux[0].row_len"),
		row("row_len 2^24+1", func(r *req) { r.Layout.Aux[0].RowLen = 1<<24 + 1 }, inv, "layout.aux[0].row_len"),
		row("aux length below the slots", func(r *req) { r.Layout.Aux[0].Length = 16 }, inv, "layout.aux[0].length: 16 does not hold the 48 metadata slots"),
		row("no marker", func(r *req) { r.Layout.Marker = "" }, inv, "layout.marker: is required"),
		row("marker not an aux buffer", func(r *req) { r.Layout.Marker = r.Layout.Kv[0].Name }, inv, "layout.marker: \"eng/tp1/k/0\" is not one of the aux buffers"),
		row("marker row of 4 bytes", func(r *req) { r.Layout.Aux[1].RowLen, r.Layout.Aux[1].Length = 4, 4096 }, inv, "layout.aux[1].row_len: 4 is too short for the marker buffer's row"),
		row("state on a GQA pool", func(r *req) {
			r.Layout.State = []*pb.EngineStateBuffer{{Name: "eng/tp1/mamba", Type: pb.StateType_STATE_TYPE_MAMBA, ItemLen: 64, Length: 1 << 20}}
		}, inv, "layout.state[0].type: MAMBA is not a state type of a GQA pool"),
		row("state DSA", func(r *req) {
			r.Layout.State = []*pb.EngineStateBuffer{{Name: "eng/tp1/dsa", Type: pb.StateType_STATE_TYPE_DSA, ItemLen: 64, Length: 1 << 20}}
		}, inv, "layout.state[0].type: STATE_TYPE_DSA is not a state buffer's type"),
		row("memory without a kind", func(r *req) { r.Layout.Kv[0].Memory = &pb.EngineMemory{} }, inv, "layout.kv[0].memory: has no kind"),
		row("shared path relative", func(r *req) { r.Layout.Kv[0].Memory = shm("dev/shm/x", 0) }, inv, "layout.kv[0].memory.shared.path"),
		row("shared path with NUL", func(r *req) { r.Layout.Kv[0].Memory = shm("/dev/shm/x\x00y", 0) }, inv, "layout.kv[0].memory.shared.path"),
		row("shared offset unaligned", func(r *req) { r.Layout.Aux[0].Memory = shm("/dev/shm/x", 100) }, inv, "layout.aux[0].memory.shared.offset: 100 must be a multiple of 4096"),
		row("cuda handle of 63 bytes", func(r *req) {
			r.Layout.Kv[0].Memory = &pb.EngineMemory{Kind: &pb.EngineMemory_CudaIpc{CudaIpc: &pb.EngineCudaIpc{Handle: make([]byte, 63)}}}
		}, inv, "layout.kv[0].memory.cuda_ipc.handle: has 63 bytes"),
		row("cuda device 1024", func(r *req) {
			r.Layout.Kv[0].Memory = &pb.EngineMemory{Kind: &pb.EngineMemory_CudaIpc{CudaIpc: &pb.EngineCudaIpc{Handle: make([]byte, 64), Device: 1024}}}
		}, inv, "layout.kv[0].memory.cuda_ipc.device"),
		row("empty nixl descriptor", func(r *req) {
			r.Layout.Kv[0].Memory = &pb.EngineMemory{Kind: &pb.EngineMemory_Nixl{Nixl: &pb.EngineNixl{}}}
		}, inv, "layout.kv[0].memory.nixl.serialized"),
		utf8Row(t, conn, pb.Rooms_RegisterEngineLayout_FullMethodName, false, good, func(r *req) { r.Layout.Kv[0].Name = utf8Slot }, "layout.kv[0].name"),
		rawRow(conn, pb.Rooms_RegisterEngineLayout_FullMethodName, false, []byte{0x1a, 0x05, 0x0a}, "layout: cannot be decoded"),
	}
	transfer := func(ctx context.Context, r *pb.TransferRequest) error { _, err := rooms.Transfer(ctx, r); return err }
	goodT := func() *pb.TransferRequest {
		return &pb.TransferRequest{Room: 5, Rank: &pb.PrefillRank{BootstrapAddr: "10.0.0.1:8998"}, NumPages: 1, Last: true, Aux: &pb.Aux{RoomMarker: 5},
			Source: &pb.TransferSource{Buffer: "p", PageIndices: []int32{1}, AuxRow: proto.Uint32(3)}}
	}
	notLast := func(r *pb.TransferRequest) { r.Last, r.Aux = false, nil }
	return append(rows,
		unaryRow("Transfer aux_row before the last chunk", goodT, notLast, transfer, inv, "source.aux_row: is set on a chunk that is not the last"),
		unaryRow("Transfer aux_row 2^24", goodT, func(r *pb.TransferRequest) { r.Source.AuxRow = proto.Uint32(1 << 24) }, transfer, inv, "source.aux_row: 16777216 is out of range"),
		unaryRow("Transfer state before the last chunk", goodT, func(r *pb.TransferRequest) {
			notLast(r)
			r.Source.AuxRow = nil
			r.Source.State = []*pb.StateIndices{{Type: pb.StateType_STATE_TYPE_MAMBA, Indices: []int32{1}}}
		}, transfer, inv, "source.state: is set on a chunk that is not the last"),
		unaryRow("Transfer state type twice", goodT, func(r *pb.TransferRequest) {
			r.Source.State = []*pb.StateIndices{{Type: pb.StateType_STATE_TYPE_SWA}, {Type: pb.StateType_STATE_TYPE_SWA}}
		}, transfer, inv, "source.state[1].type: STATE_TYPE_SWA is named twice"),
		unaryRow("Transfer state index negative", goodT, func(r *pb.TransferRequest) {
			r.Source.State = []*pb.StateIndices{{Type: pb.StateType_STATE_TYPE_MAMBA, Indices: []int32{-1}}}
		}, transfer, inv, "source.state[0].indices[0]: -1 is negative"),
	)
}

// TestRegisterEngineLayoutRefusals: what the daemon's state decides — the
// daemon owns the pages, staging is on — is FAILED_PRECONDITION with the
// setting and the fix.
func TestRegisterEngineLayoutRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*kvlayout.Config)
		want string
	}{
		{"daemon owns the pages", func(c *kvlayout.Config) { c.Pool.Owner = kvlayout.OwnerDaemon }, "kv_pool.owner is daemon"},
		{"staging on", func(c *kvlayout.Config) { c.Staging.Enabled = true }, "staging.enabled is true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := layoutConf()
			tc.mut(&dec)
			d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
				c.Transfer.Backend, c.KVPool, c.Parallel, c.Staging, c.Admission = dec.Backend, dec.Pool, dec.Parallel, dec.Staging, dec.Admission
			}})
			_, err := pb.NewRoomsClient(d.Conn(t)).RegisterEngineLayout(t.Context(), &pb.RegisterEngineLayoutRequest{Layout: goodLayout(0)})
			if c := status.Code(err); c != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("RegisterEngineLayout = %v; want FailedPrecondition naming %q", err, tc.want)
			}
		})
	}
}

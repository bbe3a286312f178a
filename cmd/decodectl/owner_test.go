package main

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// declared is a declaration of 16 pages from first on (a 1000-token prompt
// at 64 tokens a page) and metadata row slot.
func declared(room uint64, first, slot int32) *pb.DeclareDestinationRequest {
	req := &pb.DeclareDestinationRequest{Room: room, MetadataSlot: slot}
	for p := first; p < first+16; p++ {
		req.PageIndices = append(req.PageIndices, p)
	}
	return req
}

// TestStatusEngineOwner: with the decode engine as the page owner, status
// says so, shows each shard's hand-off ledger (rooms waiting for their
// declaration, held and draining rooms and pages, refused declarations,
// whether the engine reported its capacity) and the capacity the engine
// reported in the shard table; room shows a queued room waiting for the
// engine's declaration.
func TestStatusEngineOwner(t *testing.T) {
	t.Parallel()
	td := daemontest.Start(t, daemontest.Options{TCP: true, Config: func(c *config.Config) { c.KVPool.Owner = kvlayout.OwnerEngine }})
	c, err := client.New(td.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	d := &testDaemon{addr: td.Addr, Daemon: td, c: c}
	d.register(t, prefillRank(prefillA, 1, 0))
	d.open(t, prefillA, 1, 1000)
	d.open(t, prefillA, 2, 1000)
	if _, err := c.Engine().DeclareDestination(testCtx(t), declared(1, 0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Engine().DeclareDestination(testCtx(t), declared(2, 8, 1)); !errors.Is(err, client.ErrFailedPrecondition) {
		t.Fatalf("declaring room 1's page 8 for room 2 = %v; want refused", err)
	}

	out := d.mustCtl(t, "status")
	for _, want := range []string{
		"Page owner:     engine (the decode engine allocates each room's pages and declares them: DeclareDestination)\n",
		"Hand-off ledger (pages the engine declared, held until each hand-off ends):\n",
		"SHARD  WAITING FOR DECLARATION  HELD ROOMS/PAGES  DRAINING ROOMS/PAGES  REFUSED (PAGE HELD)  CAPACITY REPORTED\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// The first 0 row is the shard table's (no capacity reported: all
	// used, blocked by engine_unreported); the hand-off ledger's follows.
	if row := rowOf(out, "0"); row[len(row)-1] != "engine_unreported" {
		t.Errorf("shard row %q; want blocked by engine_unreported before the engine's first capacity report", row)
	}
	holds := lastRowOf(out, "0")
	if want := []string{"0", "1", "1/16", "0/0", "1", "no"}; !cmp.Equal(holds, want) {
		t.Errorf("hand-off ledger row: %s\n%s", cmp.Diff(want, holds), out)
	}

	if _, err := c.Engine().ReportCapacity(testCtx(t), &pb.ReportCapacityRequest{TokensFree: 64 * 1000, PagesFree: 1000, ReqSlotsFree: 30,
		MetadataSlotsFree: 60, QueueDepth: 1, Running: 3}); err != nil {
		t.Fatal(err)
	}
	out = d.mustCtl(t, "status")
	if row := rowOf(out, "0"); len(row) < 8 || row[1] != "15384/16384" || row[len(row)-1] != "none" || row[len(row)-2] != "1/0/3" {
		t.Errorf("shard row %q; want the engine's reported capacity (1000 of 16384 pages free; room 1 admitted, 3 running), blocked by none\n%s", row, out)
	}
	if holds := lastRowOf(out, "0"); holds[len(holds)-1] != "yes" {
		t.Errorf("hand-off ledger row %q; want the capacity reported", holds)
	}

	out = d.mustCtl(t, "room", "2")
	for _, want := range []string{
		"State:        queued (KVPoll WaitingForInput)\n",
		"Waiting for:  the decode engine's declaration of the destination it allocated (DeclareDestination) on decode DP shard 0; bounded by timeouts.bootstrap",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("room 2 lacks %q:\n%s", want, out)
		}
	}
	for _, room := range []uint64{1, 2} {
		if _, err := c.Engine().AbortRoom(testCtx(t), &pb.AbortRoomRequest{Room: room}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatusDaemonOwner: the default owner is named, and no hand-off
// ledger is shown.
func TestStatusDaemonOwner(t *testing.T) {
	t.Parallel()
	d := startDaemon(t, daemonConfig{})
	out := d.mustCtl(t, "status")
	if !strings.Contains(out, "Page owner:     daemon (OpenRoom admits each room and chooses its pages)\n") || strings.Contains(out, "Hand-off ledger") {
		t.Errorf("status of a daemon-owned pool:\n%s", out)
	}
}

// lastRowOf returns the fields of the last table row whose first field is
// key.
func lastRowOf(out, key string) []string {
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == key {
			row = f
		}
	}
	return row
}

package fleet_test

import (
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
	"github.com/decodeplane/decodeplane/kvlayout"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// TestEngineOwnerCapacityInEtcd: a daemon whose decode engine owns the
// pages publishes under capacity/<advertise_address> what the engine
// reports (ReportCapacity), exactly as WatchCapacity shows it: 0 free and
// blocked_by engine_unreported before the first report, the engine's
// figures after, the pool's size the daemon's.
func TestEngineOwnerCapacityInEtcd(t *testing.T) {
	e := etcdtest.Start(t)
	const addr = "10.9.1.1:7600"
	d := daemontest.Start(t, daemontest.Options{Config: func(c *config.Config) {
		c.KVPool.Owner = kvlayout.OwnerEngine
		c.Registry.Backend = fleet.BackendEtcd
		c.Registry.Etcd.Endpoints = e.Endpoint()
		c.Registry.Etcd.AdvertiseAddress = addr
		c.Registry.Etcd.Prefix = "/test/"
		c.Registry.Etcd.CapacityInterval = fleet.MinCapacityInterval
		c.Registry.Etcd.RequestTimeout, c.Registry.Etcd.DialTimeout = time.Second, time.Second
	}})
	c, err := client.New(daemontest.Target, client.WithDialOptions(d.Dialer()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx := ctxFor(t, 30*time.Second)
	key := "/test/capacity/" + url.PathEscape(addr)
	published := func() *pb.ShardCapacity {
		resp, err := cli.Get(ctx, key)
		if err != nil || len(resp.Kvs) != 1 {
			return nil
		}
		var u pb.CapacityUpdate
		if err := protojson.Unmarshal(resp.Kvs[0].Value, &u); err != nil {
			t.Fatalf("%s holds %q: %v", key, resp.Kvs[0].Value, err)
		}
		if len(u.GetShards()) != 1 {
			return nil
		}
		return u.GetShards()[0]
	}
	var sc *pb.ShardCapacity
	waitFor(t, "the capacity record", func() bool { sc = published(); return sc != nil })
	if sc.GetBlockedBy() != "engine_unreported" || sc.GetTokensFree() != 0 || sc.GetPagesTotal() != 16384 {
		t.Fatalf("capacity in etcd before a report = %v; want 0 free of 16384 pages, blocked by engine_unreported", sc)
	}
	if _, err := c.Engine().ReportCapacity(ctx, &pb.ReportCapacityRequest{TokensFree: 6400, PagesFree: 100, ReqSlotsFree: 7, QueueDepth: 3, Running: 9}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the engine's report in etcd", func() bool { sc = published(); return sc.GetTokensFree() == 6400 })
	want := &pb.ShardCapacity{PageSize: 64, TokensTotal: 16384 * 64, TokensFree: 6400, PagesTotal: 16384, PagesFree: 100,
		ReqSlotsTotal: sc.GetReqSlotsTotal(), ReqSlotsFree: 7, QueueDepth: 3, BlockedBy: "none", Running: 9, ReservedDecodeTokens: sc.GetReservedDecodeTokens()}
	if got := protojson.Format(sc); got != protojson.Format(want) {
		t.Fatalf("capacity in etcd after the report = %s\nwant %s", got, protojson.Format(want))
	}
	// The same figures as this daemon's own WatchCapacity.
	ws, err := pb.NewCapacityClient(d.Conn(t)).WatchCapacity(ctx, &pb.WatchCapacityRequest{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := ws.Recv()
	if err != nil || protojson.Format(u.GetShards()[0]) != protojson.Format(sc) {
		t.Fatalf("WatchCapacity = %v, %v; want what etcd holds: %v", u.GetShards(), err, sc)
	}
}

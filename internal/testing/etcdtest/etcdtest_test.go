package etcdtest_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/decodeplane/decodeplane/internal/testing/etcdtest"
)

// TestStopStartKeepsData: a value written before Stop is read after Start,
// through the same endpoint, and nothing answers in between.
func TestStopStartKeepsData(t *testing.T) {
	s := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = cli.Get(sctx, "k")
	cancel()
	if err == nil {
		t.Fatal("a Get succeeded while etcd was stopped")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r, err := cli.Get(rctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 || string(r.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v", r.Kvs)
	}
}

// TestStopIsAnOutageForLeases: a lease shorter than etcd's own shutdown
// window (embed's Close drains open streams for up to its request timeout,
// 5 s + two election timeouts, while the server would otherwise run on) is
// not expired by Stop: nothing is applied once Stop began, and after Start
// the new leader renews the lease's TTL. A watch is open across Stop, as a
// daemon's is, so that the drain lasts its whole window.
func TestStopIsAnOutageForLeases(t *testing.T) {
	s := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ttl = 5 // seconds: registry.etcd.lease_ttl's minimum
	g, err := cli.Grant(ctx, ttl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "leased", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := cli.Watch(wctx, "leased")
	var deleted bool
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					deleted = true
				}
			}
		}
	}()
	stopping := time.Now()
	s.Stop()
	stopped := time.Since(stopping)
	wcancel()
	<-watched
	if deleted {
		t.Fatalf("the lease (TTL %ds) expired during Stop (%v): the watch saw its key deleted", ttl, stopped)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	r, err := cli.Get(ctx, "leased")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 {
		t.Fatalf("the leased key is gone after Stop (%v) and Start: the lease expired during the outage", stopped)
	}
	tr, err := cli.TimeToLive(ctx, g.ID)
	if err != nil || tr.TTL <= 0 {
		t.Fatalf("the lease after Start: %v %v", tr, err)
	}
	t.Logf("Stop took %v; the lease's TTL after Start is %ds", stopped.Round(time.Millisecond), tr.TTL)
}

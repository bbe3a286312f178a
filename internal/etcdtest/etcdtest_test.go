package etcdtest_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/decodeplane/decodeplane/internal/etcdtest"
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

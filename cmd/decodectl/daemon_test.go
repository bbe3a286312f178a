package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/config"
	"github.com/decodeplane/decodeplane/internal/daemon"
	"github.com/decodeplane/decodeplane/internal/testing/daemontest"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
	"github.com/decodeplane/decodeplane/server"
)

// daemonConfig adjusts a test daemon.
type daemonConfig struct {
	// token is the daemon's bootstrap token (server.auth_token).
	token string
	// serverOptions are extra grpc.Server options (TLS credentials).
	serverOptions []grpc.ServerOption
	// clientOptions are given to the test's own client (TLS).
	clientOptions []client.Option
}

// testDaemon is a decodeplane daemon built by the composition root
// (internal/daemon, through internal/testing/daemontest) with the simulated
// transfer engine, served on a real loopback TCP listener.
type testDaemon struct {
	addr string
	*daemontest.Daemon
	// c is a client of the daemon, with its token.
	c *client.Client
}

// startDaemon serves a daemon for the test and stops it at cleanup.
func startDaemon(t *testing.T, dc daemonConfig) *testDaemon {
	t.Helper()
	td := daemontest.Start(t, daemontest.Options{
		TCP: true,
		Config: func(c *config.Config) {
			c.Server.AuthToken = dc.token
		},
		Daemon: daemon.Options{
			Version: "test-1.2.3",
			Entries: []server.ConfigEntry{
				{Key: "kv_pool.kind", Value: "gqa", Source: "default"},
				{Key: "server.auth_token", Value: "<redacted>", Source: "env SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"},
			},
			ServerOptions: dc.serverOptions,
		},
	})
	d := &testDaemon{addr: td.Addr, Daemon: td}
	opts := dc.clientOptions
	if dc.token != "" {
		opts = append(opts, client.WithToken(dc.token))
	}
	c, err := client.New(d.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	d.c = c
	return d
}

// ctx is a context bounded for one test step.
func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// prefillRank describes rank tpRank of a prefill instance at addr, with the
// decode side's page size and dtype.
func prefillRank(addr string, tp, tpRank uint32) *pb.RegisterPrefillRequest {
	return &pb.RegisterPrefillRequest{
		BootstrapAddr: addr,
		RankEndpoint:  fmt.Sprintf("10.0.0.1:%d", 17000+tpRank),
		Parallel:      &pb.ParallelInfo{AttnTpSize: tp, AttnTpRank: tpRank, PpSize: 1},
		PageSize:      64,
		KvCacheDtype:  "bf16",
		InstanceId:    "prefill-" + addr,
	}
}

// register registers a prefill rank.
func (d *testDaemon) register(t *testing.T, reg *pb.RegisterPrefillRequest) *client.Prefill {
	t.Helper()
	p := d.c.Prefill(reg)
	if _, err := p.Register(testCtx(t)); err != nil {
		t.Fatalf("register %s: %v", reg.GetBootstrapAddr(), err)
	}
	return p
}

// open opens a room of prompt tokens for the prefill at addr. Its context
// has no deadline: the rooms of these scenarios have no time budget (the
// Go client would send the context's as the room's timeout).
func (d *testDaemon) open(t *testing.T, addr string, room uint64, prompt uint32) {
	t.Helper()
	if _, err := d.c.Engine().OpenRoom(t.Context(), &pb.OpenRoomRequest{
		Rid: fmt.Sprintf("req-%d", room), BootstrapAddr: addr, Room: room, PromptLen: prompt, MaxNewTokens: 128,
	}); err != nil {
		t.Fatalf("open room %d: %v", room, err)
	}
}

// succeed opens a room and delivers its KV in chunks of 4 pages.
func (d *testDaemon) succeed(t *testing.T, p *client.Prefill, addr string, room uint64, prompt uint32) {
	t.Helper()
	d.open(t, addr, room, prompt)
	if _, err := p.SendRoom(testCtx(t), room, client.SendOptions{ChunkPages: 4}); err != nil {
		t.Fatalf("send room %d: %v", room, err)
	}
}

// result is one decodectl run.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\n--- stdout\n%s--- stderr\n%s", r.code, r.stdout, r.stderr)
}

// decodectl runs the CLI in-process with environ and args.
func decodectl(environ []string, args ...string) result {
	var stdout, stderr bytes.Buffer
	code := run(args, environ, &stdout, &stderr)
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ctl runs the CLI against d (--addr first, as an operator would type it).
func (d *testDaemon) ctl(args ...string) result {
	return decodectl(nil, append([]string{"--addr", d.addr}, args...)...)
}

// mustCtl runs the CLI against d and fails the test unless it exits 0.
func (d *testDaemon) mustCtl(t *testing.T, args ...string) string {
	t.Helper()
	r := d.ctl(args...)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("decodectl %s: %v", strings.Join(args, " "), r)
	}
	return r.stdout
}

// rowOf returns the fields of the table row whose first field is key.
func rowOf(out, key string) []string {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == key {
			return f
		}
	}
	return nil
}

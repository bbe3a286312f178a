package faults

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/decodeplane/decodeplane/client"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Daemon is one `decodeplane serve` process of a scenario (restarted in
// place, on the same ports, by Restart) and a Go client of it.
type Daemon struct {
	s           *Stage
	name        string
	Addr        string // gRPC
	MetricsAddr string
	sets        []string
	p           *proc
	C           *client.Client
	admin       pb.AdminClient
	rooms       pb.RoomsClient
	mu          sync.Mutex
}

// startDaemon starts a daemon with the scenario's settings (key=value,
// each a --set) on free loopback ports and waits until it serves.
func (s *Stage) startDaemon(ctx context.Context, name string, sets ...string) (*Daemon, error) {
	var last error
	for range 3 { // a port taken between choosing it and the daemon's listen: another one
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		maddr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		d := &Daemon{s: s, name: name, Addr: addr, MetricsAddr: maddr, sets: sets}
		if last = d.run(ctx, nil); last == nil {
			s.mu.Lock()
			s.daemons = append(s.daemons, d)
			s.mu.Unlock()
			return d, nil
		}
		if d.p == nil || !strings.Contains(d.p.tail(20), "address already in use") {
			return nil, last
		}
	}
	return nil, last
}

// run starts the process (with extra settings) and waits for SERVING.
func (d *Daemon) run(ctx context.Context, extra []string) error {
	args := []string{"serve", "--listen", d.Addr, "--set", "server.metrics_listen=" + d.MetricsAddr}
	for _, kv := range append(append([]string(nil), d.sets...), extra...) {
		args = append(args, "--set", strings.ReplaceAll(kv, "{addr}", d.Addr)) // a fleet daemon advertises its own address
	}
	p, err := d.s.start(d.name, d.s.o.Bins.Daemon, args...)
	if err != nil {
		return err
	}
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
	d.s.mu.Lock()
	d.s.logged = append(d.s.logged, p)
	d.s.mu.Unlock()
	if d.C == nil {
		c, err := client.New(d.Addr)
		if err != nil {
			return err
		}
		d.C = c
		d.admin, d.rooms = pb.NewAdminClient(c.Conn()), pb.NewRoomsClient(c.Conn())
	}
	return waitServing(ctx, d.Addr, p)
}

// waitServing watches addr's gRPC health until SERVING, within 30 s.
func waitServing(ctx context.Context, addr string, p *proc) error {
	bo := backoff.DefaultConfig
	bo.BaseDelay, bo.MaxDelay = 20*time.Millisecond, 200*time.Millisecond
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: time.Second}))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		st, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err != nil {
			done <- err
			return
		}
		for {
			resp, err := st.Recv()
			if err != nil {
				done <- err
				return
			}
			if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
				done <- nil
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s never served: %w\n%s", p.name, err, p.tail(20))
		}
		return nil
	case <-p.exited:
		cancel()
		<-done
		return fmt.Errorf("%s exited before serving (%v):\n%s", p.name, p.err, p.tail(20))
	}
}

// proc is the daemon's current process.
func (d *Daemon) proc() *proc {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p
}

// Kill kills the daemon (SIGKILL) after scraping its reuse counter.
func (d *Daemon) Kill(ctx context.Context) error {
	d.s.scrapeViolations(ctx, d)
	return d.proc().signal(syscall.SIGKILL)
}

// Restart starts the daemon again on the same ports (after Kill), with
// extra settings, and waits until it serves.
func (d *Daemon) Restart(ctx context.Context, extra ...string) error {
	if d.proc().running() {
		return fmt.Errorf("restart %s: it is still running", d.name)
	}
	return d.run(ctx, extra)
}

// Pause stops the process (SIGSTOP); Resume continues it (SIGCONT).
func (d *Daemon) Pause() error  { return d.proc().signal(syscall.SIGSTOP) }
func (d *Daemon) Resume() error { return d.proc().signal(syscall.SIGCONT) }

func (d *Daemon) closeClient() {
	if d.C != nil {
		d.C.Close()
	}
}

// metrics scrapes /metrics: each metric's samples summed over its labels.
func (d *Daemon) metrics(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.MetricsAddr+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", d.name, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parse %s's /metrics: %w", d.name, err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			switch {
			case m.Counter != nil:
				out[name] += m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[name] += m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}

// metric is one metric of the daemon (summed over its labels).
func (d *Daemon) metric(ctx context.Context, name string) (float64, error) {
	ms, err := d.metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := ms[name]
	if !ok {
		return 0, fmt.Errorf("%s's /metrics has no %s", d.name, name)
	}
	return v, nil
}

const reuseMetric = "decodeplane_page_reuse_violations_total"

// scrapeViolations records the daemon process's reuse counter; a scrape
// that fails is a failed check (the counter must be readable).
func (s *Stage) scrapeViolations(ctx context.Context, d *Daemon) {
	p := d.proc()
	v, err := d.metric(ctx, reuseMetric)
	if err != nil {
		s.res.fail("%v", err)
		return
	}
	s.mu.Lock()
	s.violations[p] = v
	s.mu.Unlock()
}

// status is the daemon's GetStatus.
func (d *Daemon) status(ctx context.Context) (*pb.GetStatusResponse, error) {
	return d.admin.GetStatus(ctx, &pb.GetStatusRequest{})
}

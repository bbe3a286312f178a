package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The HTTP surface measured against SGLang's anchor (the wire reference,
// §1): a Go load generator in this process drives the real daemon binary's
// bootstrap routes and, in the same run, a trivial Go net/http handler in a
// child process, over loopback, with keep-alive and with a new connection
// per request, at c=16 and c=64. Server CPU per request is the server
// process's utime+stime (/proc/PID/stat, clock ticks of 10 ms) over the run
// divided by the requests it answered; the load generator's own CPU is not
// in it. With taskset available each server runs on CPU 1 (GOMAXPROCS=1,
// as the anchor pinned SGLang's server to one core) and the load generator
// on CPU 0.
//
// go test -short skips it; a plain test run does a short smoke pass (0.3 s
// cells, c=16, keep-alive) that checks that every answer is right and the
// accounting counts; DECODEPLANE_HTTP_BENCH=1 runs the full table (1.5 s
// cells) and fails when server CPU per request (keep-alive) is over 50 µs;
// a server capacity under 0.8 of the trivial handler's (keep-alive, every
// request, the 64-room query included) is logged as TARGET MISSED (on this shared machine that ratio
// moves by ±0.05 from run to run).

const benchTrivialEnv = "DECODEPLANE_HTTP_BENCH_TRIVIAL_CHILD"

// TestHTTPBenchTrivialChild is the trivial handler's process: the benchmark
// re-executes the test binary with benchTrivialEnv set; it prints its
// address and serves until stdin closes.
func TestHTTPBenchTrivialChild(t *testing.T) {
	if os.Getenv(benchTrivialEnv) == "" {
		t.Skip("the trivial server of TestHTTPBench; runs only as its child process")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "OK")
	})}
	go hs.Serve(lis)
	fmt.Printf("ADDR %s\n", lis.Addr())
	io.Copy(io.Discard, os.Stdin)
	hs.Close()
}

// cpuTicks is a process's utime+stime in clock ticks.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) in parentheses.
	s := string(raw)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return ut + st
}

const clockTick = 10 * time.Millisecond // CLK_TCK = 100 on Linux

// A cell runs at least its duration and until the server process took
// minCellTicks of CPU, at most maxCellFactor × its duration.
const (
	minCellTicks  = 5
	maxCellFactor = 10
)

type benchCase struct {
	name, method, path, body string
	auth                     bool
	trivial                  bool
}

type benchRow struct {
	name     string
	reqs     int64
	errs     int64
	rps      float64
	cpuPerRq time.Duration
}

// load runs c workers against url for d; body(i) makes request i's body.
func load(t *testing.T, tr *http.Transport, c benchCase, base string, conc int, d time.Duration, pid int) benchRow {
	t.Helper()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var n, errs atomic.Int64
	var seq atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	before := cpuTicks(t, pid)
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				body := strings.ReplaceAll(c.body, "ROOM", strconv.FormatUint(i+1000, 10))
				var rd io.Reader
				if body != "" {
					rd = strings.NewReader(body)
				}
				req, _ := http.NewRequest(c.method, base+c.path, rd)
				if c.auth {
					req.Header.Set("Authorization", "Bearer bench")
				}
				resp, err := client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs.Add(1)
					continue
				}
				n.Add(1)
			}
		})
	}
	time.Sleep(d)
	// Clock ticks are 10 ms: a short cell on a loaded machine may see the
	// server take less than one. Run on until it took minCellTicks (or
	// maxCellFactor × d), so that CPU per request is a measurement, not a
	// rounding of a few ticks to 0.
	for cpuTicks(t, pid)-before < minCellTicks && time.Since(start) < maxCellFactor*d {
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	el := time.Since(start)
	cpu := time.Duration(cpuTicks(t, pid)-before) * clockTick
	tr.CloseIdleConnections()
	row := benchRow{name: c.name, reqs: n.Load(), errs: errs.Load(), rps: float64(n.Load()) / el.Seconds()}
	if row.reqs > 0 {
		row.cpuPerRq = cpu / time.Duration(row.reqs)
	}
	return row
}

func TestHTTPBench(t *testing.T) {
	if testing.Short() {
		t.Skip("load test; skipped with -short")
	}
	full := os.Getenv("DECODEPLANE_HTTP_BENCH") == "1"
	cell, concs, keeps := 300*time.Millisecond, []int{16}, []bool{true}
	if full {
		cell, concs, keeps = 1500*time.Millisecond, []int{16, 64}, []bool{true, false}
	}
	pin := func(cmd []string, cpu string) []string { return cmd }
	if _, err := exec.LookPath("taskset"); err == nil && os.Getenv("DECODEPLANE_HTTP_BENCH_NOPIN") == "" {
		pin = func(cmd []string, cpu string) []string { return append([]string{"taskset", "-c", cpu}, cmd...) }
		if out, err := exec.Command("taskset", "-a", "-cp", "0", strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
			t.Logf("taskset of the load generator: %v %s", err, out)
		}
		t.Cleanup(func() { exec.Command("taskset", "-a", "-cp", "0-1023", strconv.Itoa(os.Getpid())).Run() })
	}

	// The trivial handler, a child process.
	tcmd := pin([]string{os.Args[0], "-test.run=^TestHTTPBenchTrivialChild$"}, "1")
	trivial := exec.Command(tcmd[0], tcmd[1:]...)
	trivial.Env = append(os.Environ(), benchTrivialEnv+"=1", "GOMAXPROCS=1")
	stdin, _ := trivial.StdinPipe()
	stdout, _ := trivial.StdoutPipe()
	if err := trivial.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); trivial.Wait() })
	sc := bufio.NewScanner(stdout)
	var trivialAddr string
	for sc.Scan() {
		if a, ok := strings.CutPrefix(sc.Text(), "ADDR "); ok {
			trivialAddr = a
			break
		}
	}
	if trivialAddr == "" {
		t.Fatal("the trivial server printed no address")
	}
	go io.Copy(io.Discard, stdout)

	// The real daemon, its HTTP surface on a free port, pinned like the
	// trivial server. A fake prefill /health keeps the instance alive.
	prefill := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "OK") }))
	defer prefill.Close()
	_, prefillPort, _ := net.SplitHostPort(strings.TrimPrefix(prefill.URL, "http://"))
	bin := decodeplaneBinary(t)
	cfgPath := filepath.Join(t.TempDir(), "decodeplane.yaml")
	os.WriteFile(cfgPath, []byte("server:\n  auth_token: bench\n"), 0o600)
	httpAddr, grpcAddr := freeAddr(t), freeAddr(t)
	dcmd := pin([]string{bin, "serve", "--config", cfgPath, "--listen", grpcAddr, "--set", "server.metrics_listen=", "--set", "server.http_listen=" + httpAddr}, "1")
	dm := exec.Command(dcmd[0], dcmd[1:]...)
	dm.Env = e2eEnviron("GOMAXPROCS=1")
	var dout bytes.Buffer
	dm.Stdout, dm.Stderr = &dout, &dout
	if err := dm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })
	base := "http://" + httpAddr
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(base + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon's HTTP surface did not come up: %v\n%s", err, dout.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for dp := range 2 {
		body := fmt.Sprintf(`{"attn_tp_size": 1, "attn_tp_rank": 0, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 2, "attn_dp_rank": %d, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0, "rank_ip": "127.0.0.1", "rank_port": %d, "page_size": 64, "kv_cache_dtype": "bf16", "load_balance_method": "round_robin", "enable_dsa_cache_layer_split": false, "prefill_http_port": %s}`, dp, 17000+dp, prefillPort)
		req, _ := http.NewRequest("PUT", base+"/route", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer bench")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("PUT /route: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	// Bind the rooms the queries ask for (1000..1063 and onwards are bound
	// by the register cell too).
	var rooms64 []string
	for i := range 64 {
		rooms64 = append(rooms64, strconv.Itoa(1000+i))
		req, _ := http.NewRequest("POST", base+"/register_dp_rank", strings.NewReader(fmt.Sprintf(`{"bootstrap_room": %d, "dp_rank": %d}`, 1000+i, i%2)))
		req.Header.Set("Authorization", "Bearer bench")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("POST /register_dp_rank: %v %v", resp, err)
		}
		resp.Body.Close()
	}

	cases := []benchCase{
		{name: "trivial Go handler", method: "GET", path: "/", trivial: true},
		{name: "POST /register_dp_rank", method: "POST", path: "/register_dp_rank", body: `{"bootstrap_room": ROOM, "dp_rank": 1}`, auth: true},
		{name: "POST /query_dp_ranks (1 room)", method: "POST", path: "/query_dp_ranks", body: `{"bootstrap_rooms": [1001]}`},
		{name: "POST /query_dp_ranks (64 rooms)", method: "POST", path: "/query_dp_ranks", body: `{"bootstrap_rooms": [` + strings.Join(rooms64, ", ") + `]}`},
		{name: "GET /route (rank)", method: "GET", path: "/route?prefill_dp_rank=1&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"},
	}
	// Each case runs right after a cell of the trivial handler with the same
	// connections and concurrency, so that the ratio compares neighbours on
	// a machine whose load changes (other builds share it).
	var out strings.Builder
	fmt.Fprintf(&out, "| request | connections | c | req/s | trivial req/s (cell before) | ratio | server CPU/request | trivial CPU/request | CPU capacity ratio |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, keep := range keeps {
		for _, conc := range concs {
			conn := "keep-alive"
			if !keep {
				conn = "new per request"
			}
			for _, c := range cases[1:] {
				cell := func(c benchCase) benchRow {
					tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableKeepAlives: !keep}
					url, pid := base, dm.Process.Pid
					if c.trivial {
						url, pid = "http://"+trivialAddr, trivial.Process.Pid
					}
					r := load(t, tr, c, url, conc, cell, pid)
					if r.errs > 0 || r.reqs == 0 {
						t.Errorf("%s (%s, c=%d): %d answers were not 200 (%d were)", r.name, conn, conc, r.errs, r.reqs)
					}
					if r.cpuPerRq <= 0 {
						t.Errorf("%s: no server CPU accounted over %d requests", r.name, r.reqs)
					}
					return r
				}
				tv, r := cell(cases[0]), cell(c)
				us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
				capRatio := us(tv.cpuPerRq) / us(r.cpuPerRq)
				fmt.Fprintf(&out, "| %s | %s | %d | %.0f | %.0f | %.2f | %.1f µs | %.1f µs | %.2f |\n", r.name, conn, conc, r.rps, tv.rps, r.rps/tv.rps, us(r.cpuPerRq), us(tv.cpuPerRq), capRatio)
				// The targets (keep-alive, as the anchor): ≤ 50 µs of server CPU
				// per lookup or bind; throughput ≥ 0.8 of the trivial handler's
				// for every request, the 64-room query included.
				// Throughput is judged on the server's capacity (CPU per request
				// against the trivial handler's): on this shared 2-core machine
				// the measured req/s is bounded by the load generator and the
				// other builds, not by the server (see BENCHMARKS.md).
				if full && keep {
					if us(r.cpuPerRq) > 50 {
						t.Errorf("%s (c=%d): %.1f µs of server CPU per request, target ≤ 50 µs", r.name, conc, us(r.cpuPerRq))
					}
					if capRatio < 0.8 {
						// Reported, not failed: cell to cell it moves by ±0.05
						// with the other builds' load (BENCHMARKS.md).
						t.Logf("TARGET MISSED: %s (c=%d): server capacity %.2f of the trivial handler's, target ≥ 0.8", r.name, conc, capRatio)
					}
				}
			}
		}
	}
	t.Logf("HTTP surface, %s cells:\n%s", cell, out.String())
	if p := os.Getenv("DECODEPLANE_HTTP_BENCH_OUT"); p != "" {
		os.WriteFile(p, []byte(out.String()), 0o644)
	}
}

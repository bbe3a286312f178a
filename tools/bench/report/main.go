// Command report turns the raw results tools/bench/current.sh keeps in a
// directory into BENCHMARKS.md's "Current results" table (markdown on
// stdout): the machine, one row per figure, and the command of each row.
//
//	go run ./tools/bench/report DIR
//
// It reads what the script wrote there: machine.env, commands.tsv,
// loads.tsv, closed-{stream,unary}.json and .metrics, rate-{stream,unary}.json,
// queued.json, http.md, fleet.txt and etcd-{1,3}.txt. A file that is missing
// leaves its rows out, with a line saying so.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./tools/bench/report DIR")
		os.Exit(2)
	}
	r := &report{dir: os.Args[1]}
	r.run()
	if r.missing > 0 {
		os.Exit(1)
	}
}

type report struct {
	dir     string
	rows    []string
	notes   []string
	missing int
	// order is the runs the rows cite, in the order of their notes.
	order []string
}

// ref is the note number of the run name ("[2]"), numbered as rows cite
// them.
func (r *report) ref(name string) string {
	for i, n := range r.order {
		if n == name {
			return fmt.Sprintf("[%d]", i+1)
		}
	}
	r.order = append(r.order, name)
	return fmt.Sprintf("[%d]", len(r.order))
}

// tables reads the run's machine, commands and load averages.
func (r *report) tables() (env, commands, loads map[string]string) {
	env, commands, loads = map[string]string{}, map[string]string{}, map[string]string{}
	if b, ok := r.read("machine.env"); ok {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
	}
	if b, ok := r.read("commands.tsv"); ok {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, "\t"); ok {
				commands[k] = v
			}
		}
	}
	if b, ok := r.read("loads.tsv"); ok {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.SplitN(l, "\t", 3); len(f) == 3 {
				if f[1] == "start" {
					loads[f[0]] = f[2]
				} else {
					loads[f[0]] += " → " + f[2]
				}
			}
		}
	}
	return env, commands, loads
}

func (r *report) path(name string) string { return filepath.Join(r.dir, name) }

func (r *report) read(name string) ([]byte, bool) {
	b, err := os.ReadFile(r.path(name))
	if err != nil {
		r.notes = append(r.notes, fmt.Sprintf("- %s: not measured (%v)", name, err))
		r.missing++
		return nil, false
	}
	return b, true
}

// lifecycle is the part of `decodeplane bench --json` the table uses.
type lifecycle struct {
	RoomsOK     int     `json:"rooms_ok"`
	RoomsFailed int     `json:"rooms_failed"`
	RPS         float64 `json:"rooms_per_second"`
	Latency     map[string]struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"latency_ms"`
	CPU      float64 `json:"cpu_seconds_per_room"`
	Allocs   float64 `json:"heap_allocs_per_room"`
	Bytes    float64 `json:"heap_alloc_bytes_per_room"`
	Daemon   *daemon `json:"daemon"`
	Messages struct {
		Total float64 `json:"messages_total"`
	} `json:"messages_per_room"`
}

type daemon struct {
	CPU     float64 `json:"cpu_seconds_per_room"`
	Allocs  float64 `json:"heap_allocs_per_room"`
	Bytes   float64 `json:"heap_alloc_bytes_per_room"`
	Blocked float64 `json:"admission_blocked_passes"`
}

type queued struct {
	Rooms    int     `json:"rooms"`
	OpenPS   float64 `json:"opens_per_second"`
	Baseline reading `json:"baseline"`
	Queued   reading `json:"queued"`
	PerRoom  struct {
		RSSBytes    float64 `json:"rss_bytes"`
		HeapBytes   float64 `json:"heap_alloc_bytes"`
		HeapObjects float64 `json:"heap_objects"`
	} `json:"per_queued_room"`
}

type reading struct {
	RSS int64 `json:"rss_bytes"`
}

func (r *report) json(name string, v any) bool {
	b, ok := r.read(name)
	if !ok {
		return false
	}
	if err := json.Unmarshal(b, v); err != nil {
		r.notes = append(r.notes, fmt.Sprintf("- %s: %v", name, err))
		r.missing++
		return false
	}
	return true
}

func (r *report) row(cells ...string) { r.rows = append(r.rows, "| "+strings.Join(cells, " | ")+" |") }

func us(s float64) string { return fmt.Sprintf("%.1f µs", s*1e6) }

func kib(b float64) string { return fmt.Sprintf("%.2f KiB", b/1024) }

func ms(p50, p99 float64) string { return fmt.Sprintf("%.3f / %.3f", p50, p99) }

func grouped(f float64) string {
	s := strconv.FormatFloat(f, 'f', 0, 64)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// metric reads a sample of a Prometheus text exposition.
func metric(text, name string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			return v, err == nil
		}
	}
	return 0, false
}

func (r *report) run() {
	env, commands, loads := r.tables()
	r.lifecycleRows()
	r.memoryAndHTTPRows()
	r.fleetRows()
	r.print(env, commands, loads)
}

// lifecycleRows are the closed-loop and fixed-rate runs' rows, both APIs.
func (r *report) lifecycleRows() {
	ref := r.ref
	r.row("measure", "streams (the default)", "unary API", "how")
	r.row("---", "---", "---", "---")
	var closed, rate [2]lifecycle
	var haveClosed, haveRate [2]bool
	for i, api := range []string{"stream", "unary"} {
		haveClosed[i] = r.json("closed-"+api+".json", &closed[i])
		haveRate[i] = r.json("rate-"+api+".json", &rate[i])
	}
	pair := func(have [2]bool, f func(int) string) (string, string) {
		var out [2]string
		for i := range 2 {
			out[i] = "—"
			if have[i] {
				out[i] = f(i)
			}
		}
		return out[0], out[1]
	}
	how := ref("closed-stream") + " " + ref("closed-unary")
	a, b := pair(haveClosed, func(i int) string { return grouped(closed[i].RPS) })
	r.row("rooms/s, closed loop, 256 rooms in flight", "**"+a+"**", b, how)
	a, b = pair(haveClosed, func(i int) string {
		return ms(closed[i].Latency["lifecycle"].P50, closed[i].Latency["lifecycle"].P99)
	})
	r.row("room lifecycle (open → released) p50 / p99 ms, same runs", a, b, how)
	a, b = pair(haveClosed, func(i int) string {
		if closed[i].Daemon == nil {
			return "—"
		}
		return "**" + us(closed[i].Daemon.CPU) + "**"
	})
	r.row("daemon CPU per room", a, b, how)
	a, b = pair(haveClosed, func(i int) string {
		if closed[i].Daemon == nil {
			return "—"
		}
		return fmt.Sprintf("%.0f (%s)", closed[i].Daemon.Allocs, kib(closed[i].Daemon.Bytes))
	})
	r.row("daemon heap allocations per room", a, b, how)
	a, b = pair(haveClosed, func(i int) string { return us(closed[i].CPU) })
	r.row("client CPU per room (simulated engine + prefill ranks, Go client)", a, b, how)
	a, b = pair(haveClosed, func(i int) string { return fmt.Sprintf("%.2f", closed[i].Messages.Total) })
	r.row("gRPC messages per room, both ways", a, b, how)
	a, b = pair(haveClosed, func(i int) string {
		m, ok := r.read("closed-" + []string{"stream", "unary"}[i] + ".metrics")
		if !ok {
			return "—"
		}
		rss, ok := metric(string(m), "process_resident_memory_bytes")
		if !ok {
			return "—"
		}
		return fmt.Sprintf("%.0f MiB", rss/(1<<20))
	})
	r.row("daemon resident memory after the run (≤ 256 rooms in flight, 10,000 finished rooms retained)", a, b, how)
	how = ref("rate-stream") + " " + ref("rate-unary")
	a, b = pair(haveRate, func(i int) string {
		return ms(rate[i].Latency["open_to_destination"].P50, rate[i].Latency["open_to_destination"].P99)
	})
	r.row("open → destination p50 / p99 ms, 200 rooms/s", a, b, how)
	a, b = pair(haveRate, func(i int) string {
		return ms(rate[i].Latency["last_chunk_to_engine_told"].P50, rate[i].Latency["last_chunk_to_engine_told"].P99)
	})
	r.row("last chunk → engine told p50 / p99 ms, 200 rooms/s", a, b, how)
	for i := range 2 {
		for _, l := range []lifecycle{closed[i], rate[i]} {
			if l.RoomsFailed > 0 {
				r.notes = append(r.notes, fmt.Sprintf("- %d rooms failed in a %s run: its figures are suspect", l.RoomsFailed, []string{"stream", "unary"}[i]))
			}
		}
	}

}

// memoryAndHTTPRows are the queued rooms' memory and the HTTP routes'.
func (r *report) memoryAndHTTPRows() {
	ref := r.ref
	var q queued
	if r.json("queued.json", &q) {
		r.row(fmt.Sprintf("daemon memory per queued room (%s rooms queued behind a full pool)", grouped(float64(q.Rooms))),
			fmt.Sprintf("**%s** resident, %s of Go heap (%.1f objects)", kib(q.PerRoom.RSSBytes), kib(q.PerRoom.HeapBytes), q.PerRoom.HeapObjects),
			"(same)", ref("queued"))
		r.row("daemon resident memory, empty → with those rooms queued",
			fmt.Sprintf("%.0f → %.0f MiB", float64(q.Baseline.RSS)/(1<<20), float64(q.Queued.RSS)/(1<<20)), "(same)", ref("queued"))
	}

	if b, ok := r.read("http.md"); ok {
		// | name | conn | c | req/s | trivial req/s | ratio | server CPU/request | trivial CPU/request | capacity ratio |
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Split(strings.Trim(l, "| "), " | ")
			if len(f) != 9 || f[1] != "keep-alive" || f[2] != "16" {
				continue
			}
			r.row(fmt.Sprintf("HTTP `%s`, keep-alive, 16 clients: server CPU per request (a trivial Go handler: %s)", f[0], f[7]),
				fmt.Sprintf("%s; capacity %s of the trivial handler's", f[6], f[8]), "(HTTP only)", ref("http"))
		}
	}

	if b, err := os.ReadFile(r.path("http.log")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "target") {
				_, msg, _ := strings.Cut(l, ": ")
				r.notes = append(r.notes, "- HTTP, target missed: "+strings.TrimSpace(msg))
			}
		}
	}

}

// fleetRows are the fleet's figures on etcd and etcd's load per fleet size.
func (r *report) fleetRows() {
	ref := r.ref
	if b, ok := r.read("fleet.txt"); ok {
		lines := benchLines(string(b))
		// In a fixed order (the table's, not the map's).
		for _, name := range []string{"BenchmarkFleetPropagation", "BenchmarkFleetRegister/clients=1", "BenchmarkFleetRegister/clients=16", "BenchmarkFleetHeartbeat/clients=1"} {
			m, ok := lines[name]
			if !ok {
				continue
			}
			switch name {
			case "BenchmarkFleetRegister/clients=1":
				r.row("fleet on etcd: registrations through one daemon, 1 client (p50 / p99 ms)",
					fmt.Sprintf("%s/s (%.2f / %.2f)", grouped(m["registrations/s"]), m["p50-ms"], m["p99-ms"]), "(same)", ref("fleet"))
			case "BenchmarkFleetRegister/clients=16":
				r.row("fleet on etcd: registrations through one daemon, 16 clients (p50 / p99 ms)",
					fmt.Sprintf("%s/s (%.2f / %.2f)", grouped(m["registrations/s"]), m["p50-ms"], m["p99-ms"]), "(same)", ref("fleet"))
			case "BenchmarkFleetHeartbeat/clients=1":
				r.row("fleet on etcd: heartbeats/s, 1 client, fleet registry ÷ memory registry",
					fmt.Sprintf("%s / %s (%.2f)", grouped(m["fleet-hb/s"]), grouped(m["memory-hb/s"]), m["fleet/memory"]), "(same)", ref("fleet"))
			case "BenchmarkFleetPropagation":
				r.row("fleet on etcd: registration through daemon A → the room waiting on B has its destination, p50 / p99 ms",
					ms(m["p50-ms"], m["p99-ms"])+fmt.Sprintf(" (B after A answered: %s)", ms(m["after-register-p50-ms"], m["after-register-p99-ms"])), "(same)", ref("fleet"))
			}
		}
	}

	for _, d := range []string{"1", "3"} {
		b, ok := r.read("etcd-" + d + ".txt")
		if !ok {
			continue
		}
		v := map[string]float64{}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 3:
				x, _ := strconv.ParseFloat(f[2], 64)
				if f[0] == "before" {
					v[f[1]] -= x
				} else {
					v[f[1]] += x
				}
			case len(f) == 2:
				v[f[0]], _ = strconv.ParseFloat(f[1], 64)
			}
		}
		s := v["seconds"]
		if s <= 0 {
			continue
		}
		per := func(k string) string { return fmt.Sprintf("%.1f", v[k]/s) }
		r.row(fmt.Sprintf("etcd load, a fleet of %s daemon(s) at 100 rooms/s each, per second: raft commits, puts, txns, lease renewals, watch events", d),
			fmt.Sprintf("%s, %s, %s, %s, %s", per("etcd_server_proposals_committed_total"), per("etcd_mvcc_put_total"),
				per("etcd_mvcc_txn_total"), per("etcd_debugging_lease_renewed_total"), per("etcd_debugging_mvcc_events_total")),
			"(same)", ref("etcd"))
	}

}

// print writes the table, the machine, each run's command and the notes.
func (r *report) print(env, commands, loads map[string]string) {
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	fmt.Fprintf(out, "Machine: %s CPUs (`nproc`), %s, %s; %s; %s. Measured %s on %s (%s).\n\n",
		env["nproc"], env["cpu"], env["mem"], env["os"], env["go"], env["date"], env["commit"], env["version"])
	for _, l := range r.rows {
		fmt.Fprintln(out, l)
	}
	fmt.Fprintln(out)
	fmt.Fprintln(out, "How (each run by `tools/bench/current.sh`; P, M: free loopback ports; load average before → after):")
	fmt.Fprintln(out)
	for i, name := range r.order {
		fmt.Fprintf(out, "%d. `%s` (load %s)\n", i+1, commands[name], loadOf(loads, name))
	}
	if len(r.notes) > 0 {
		fmt.Fprintln(out)
		for _, n := range r.notes {
			fmt.Fprintln(out, n)
		}
	}
}

func loadOf(loads map[string]string, name string) string {
	if name == "etcd" {
		return loads["etcd-1"] + "; " + loads["etcd-3"]
	}
	return loads[name]
}

var benchName = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s`)

// benchLines reads `go test -bench` output whose result lines may be cut
// by other output (the embedded etcd logs to stdout): each benchmark's
// metrics, by name without the GOMAXPROCS suffix.
func benchLines(text string) map[string]map[string]float64 {
	out := map[string]map[string]float64{}
	var current string
	for _, line := range strings.Split(text, "\n") {
		if i := strings.Index(line, `{"level"`); i >= 0 {
			line = line[:i]
		}
		if m := benchName.FindStringSubmatch(line + " "); m != nil {
			current = m[1]
			line = strings.TrimSpace(line[len(m[0])-1:])
		}
		if current == "" || !strings.Contains(line, "ns/op") {
			continue
		}
		f := strings.Fields(line)
		vals := map[string]float64{}
		for i := 1; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				vals[f[i+1]] = v
			}
		}
		out[current] = vals
		current = ""
	}
	return out
}

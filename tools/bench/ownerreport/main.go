// Command ownerreport turns the raw results tools/bench/owner.sh keeps in a
// directory into BENCHMARKS.md's page-owner table (markdown on stdout): one
// row per API, page owner and round, then the engine's cost relative to the
// daemon's in the same round, and the command and machine.
//
//	go run ./tools/bench/ownerreport DIR
//
// It reads machine.env, loads.txt and {stream,unary}-{daemon,engine}-N.json.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// run is the part of `decodeplane bench --json` the table uses.
type run struct {
	PageOwner string  `json:"page_owner"`
	RoomsOK   int     `json:"rooms_ok"`
	Failed    int     `json:"rooms_failed"`
	RPS       float64 `json:"rooms_per_second"`
	Latency   map[string]struct {
		P50 float64 `json:"p50"`
		P99 float64 `json:"p99"`
	} `json:"latency_ms"`
	CPU    float64 `json:"cpu_seconds_per_room"`
	Allocs float64 `json:"heap_allocs_per_room"`
	Daemon *struct {
		CPU    float64 `json:"cpu_seconds_per_room"`
		Allocs float64 `json:"heap_allocs_per_room"`
		Bytes  float64 `json:"heap_alloc_bytes_per_room"`
	} `json:"daemon"`
	Messages struct {
		Total float64 `json:"messages_total"`
	} `json:"messages_per_room"`
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: go run ./tools/bench/ownerreport DIR")
		os.Exit(2)
	}
	dir := os.Args[1]
	env := map[string]string{}
	if b, err := os.ReadFile(filepath.Join(dir, "machine.env")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				env[k] = v
			}
		}
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*-*-*.json"))
	sort.Slice(names, func(i, j int) bool { return order(names[i]) < order(names[j]) })
	runs := map[string]run{}
	fmt.Println("| API | page owner | round | rooms/s | daemon CPU per room | daemon heap allocations per room | client CPU per room | messages per room | lifecycle p50 / p99 ms |")
	fmt.Println("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	bad := 0
	for _, n := range names {
		base := strings.TrimSuffix(filepath.Base(n), ".json")
		var r run
		b, err := os.ReadFile(n)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || r.Daemon == nil || r.Failed > 0 {
			fmt.Fprintf(os.Stderr, "%s: %v (daemon figures %v, %d rooms failed)\n", n, err, r.Daemon != nil, r.Failed)
			bad++
			continue
		}
		runs[base] = r
		p := strings.Split(base, "-")
		lc := r.Latency["lifecycle"]
		fmt.Printf("| %s | %s | %s | %.0f | %.1f µs | %.0f (%.2f KiB) | %.1f µs | %.2f | %.1f / %.1f |\n", p[0], p[1], p[2], r.RPS,
			r.Daemon.CPU*1e6, r.Daemon.Allocs, r.Daemon.Bytes/1024, r.CPU*1e6, r.Messages.Total, lc.P50, lc.P99)
	}
	fmt.Println()
	fmt.Println("The engine as page owner against the daemon, same API and round (engine ÷ daemon):")
	fmt.Println()
	for _, n := range names {
		base := strings.TrimSuffix(filepath.Base(n), ".json")
		p := strings.Split(base, "-")
		if p[1] != "engine" {
			continue
		}
		e, eok := runs[base]
		d, dok := runs[p[0]+"-daemon-"+p[2]]
		if !eok || !dok {
			continue
		}
		fmt.Printf("- %s, round %s: rooms/s %.2f, daemon CPU per room %.2f, daemon allocations per room %+.0f, messages per room %+.2f\n",
			p[0], p[2], e.RPS/d.RPS, e.Daemon.CPU/d.Daemon.CPU, e.Daemon.Allocs-d.Daemon.Allocs, e.Messages.Total-d.Messages.Total)
	}
	fmt.Println()
	fmt.Printf("Machine: %s CPUs, %s; %s. Measured %s on %s, %s rooms per run.\n", env["nproc"], env["cpu"], env["go"], env["date"], env["commit"], env["rooms"])
	fmt.Println()
	fmt.Printf("Each run: `%s`\n", env["command"])
	if b, err := os.ReadFile(filepath.Join(dir, "loads.txt")); err == nil {
		fmt.Println()
		fmt.Println("Load averages (1, 5, 15 min) at each run's start and end:")
		fmt.Println()
		fmt.Println("```text")
		fmt.Print(string(b))
		fmt.Println("```")
	}
	if bad > 0 {
		os.Exit(1)
	}
}

// order sorts the runs by round, then API (stream first), then owner
// (daemon first).
func order(path string) string {
	p := strings.Split(strings.TrimSuffix(filepath.Base(path), ".json"), "-")
	if len(p) != 3 {
		return path
	}
	api := map[string]string{"stream": "0", "unary": "1"}[p[0]]
	owner := map[string]string{"daemon": "0", "engine": "1"}[p[1]]
	return fmt.Sprintf("%4s%s%s", p[2], api, owner)
}

// Command decodeplane-bench benchmarks decodeplane's control path: a
// simulated decode engine and prefill fleet drive the whole room lifecycle
// over real gRPC against a daemon started in this process or an external
// one (--target), then the bare-gRPC limit of the same message mix is
// measured for comparison (see BENCHMARKS.md).
//
//	decodeplane-bench [flags]
//
// Users run it as `decodeplane bench [flags]`: the daemon binary runs this
// one from its own directory, so that the daemon links neither the client
// library nor the bench. `make build` builds both into bin/.
//
// Exit codes: 0 success, 1 a failed run, 2 a usage or configuration error.
package main

import (
	"os"

	"github.com/decodeplane/decodeplane/internal/bench"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	os.Exit(bench.Main(version, os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

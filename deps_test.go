package decodeplane_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestDomainPackagesArePure keeps the domain (prealloc, kvmanager) free of
// the transport: neither gRPC nor the generated API may be among their
// dependencies. Only the server package joins the two.
func TestDomainPackagesArePure(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "./prealloc/...", "./kvmanager/...").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	deps := strings.Fields(string(out))
	// The listing must include the packages themselves, or it proves nothing.
	for _, want := range []string{"github.com/decodeplane/decodeplane/prealloc", "github.com/decodeplane/decodeplane/kvmanager"} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps does not list %s:\n%s", want, out)
		}
	}
	forbidden := []string{"google.golang.org/grpc", "github.com/decodeplane/decodeplane/proto"}
	for _, d := range deps {
		for _, f := range forbidden {
			if d == f || strings.HasPrefix(d, f+"/") {
				t.Errorf("a domain package depends on %s (forbidden: %s)", d, f)
			}
		}
	}
}

const module = "github.com/decodeplane/decodeplane"

// depsOf lists the packages pkg links (go list -deps: non-test imports,
// transitively), pkg itself included.
func depsOf(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr)
	}
	deps := strings.Fields(string(out))
	if !slices.Contains(deps, module+strings.TrimPrefix(pkg, ".")) {
		t.Fatalf("go list -deps %s does not list the package itself:\n%s", pkg, out)
	}
	return deps
}

// TestPackageDirection keeps the tree's arrows pointing one way: the
// composition root (internal/daemon) is the only package that joins the
// inbound API (server), Prometheus (metrics), the agent client and the
// config; the reference agent links none of the daemon.
func TestPackageDirection(t *testing.T) {
	for _, tt := range []struct {
		pkg       string
		forbidden []string
	}{
		// server is the inbound API only.
		{"./server", []string{"/metrics", "/transfer/agentclient", "/transfer/agentservice", "/internal/daemon", "/internal/config"}},
		// metrics observes the domain; it does not know the API's server.
		{"./metrics", []string{"/server", "/internal/daemon"}},
		// The agent protocol's two ends share agentwire, not each other.
		{"./transfer/agentclient", []string{"/server", "/transfer/agentservice", "/metrics"}},
		{"./transfer/agentservice", []string{"/server", "/transfer/agentclient", "/kvmanager", "/metrics"}},
		// The reference agent does not link the daemon.
		{"./cmd/decodeplane-agent", []string{"/server", "/internal/daemon", "/internal/config", "/metrics", "/kvmanager", "/transfer/agentclient"}},
		// The request codec is shared by the daemon's server and the
		// reference agent's: it knows neither.
		{"./server/grpcdecode", []string{"/server", "/kvmanager", "/prealloc", "/internal/daemon", "/transfer/agentservice"}},
		// The fleet registry is an outbound adapter: it calls the room
		// manager and etcd; the wiring and the inbound API call it.
		{"./fleet", []string{"/server", "/internal/daemon", "/internal/config", "/metrics", "/client"}},
		// The config loader describes; it builds nothing.
		{"./internal/config", []string{"/internal/daemon", "/metrics", "/transfer/agentclient"}},
		// Staging is a leaf of the domain: it returns effects to the room
		// manager and never calls it or the registry (gRPC and the generated
		// API are kept out of ./kvmanager/... by TestDomainPackagesArePure);
		// of transfer it uses the contract's layer arithmetic and kvcopy's
		// buffer names, never an engine.
		{"./kvmanager/staging", []string{"/kvmanager", "/kvmanager/registry", "/server", "/transfer/sim", "/transfer/delegate", "/transfer/agentclient", "/transfer/agentservice"}},
		// The daemon binary links neither the client library nor the bench:
		// `decodeplane bench` runs the decodeplane-bench binary.
		{"./cmd/decodeplane", []string{"/client", "/internal/bench", "/proto/decodeplane/bench/v1"}},
		// decodectl is a client of the API.
		{"./cmd/decodectl", []string{"/server", "/internal/daemon", "/kvmanager"}},
		// The engine contract is a leaf under the domain: it names no engine
		// and knows neither the room manager nor the daemon.
		{"./transfer", []string{"/kvmanager", "/server", "/metrics", "/internal/daemon", "/internal/config", "/transfer/sim", "/transfer/delegate",
			"/transfer/kvcopy", "/transfer/hostmem", "/transfer/agentclient", "/transfer/agentservice", "/transfer/agentwire"}},
		// The engines implement the contract; the room manager drives them,
		// never the other way round.
		{"./transfer/sim", []string{"/kvmanager", "/server", "/metrics", "/internal/daemon", "/internal/config", "/transfer/delegate", "/transfer/agentclient"}},
		{"./transfer/delegate", []string{"/kvmanager", "/server", "/metrics", "/internal/daemon", "/internal/config", "/transfer/sim", "/transfer/agentclient", "/transfer/agentservice"}},
		{"./transfer/kvcopy", []string{"/kvmanager", "/server", "/metrics", "/internal/daemon"}},
		{"./transfer/hostmem", []string{"/kvmanager", "/server", "/metrics", "/internal/daemon"}},
		// The domain consumes the engine contract only: which engine runs is
		// the composition root's choice.
		{"./kvmanager", []string{"/transfer/sim", "/transfer/delegate", "/transfer/agentclient", "/transfer/agentservice", "/transfer/agentwire", "/transfer/hostmem"}},
		// The agent link's TLS section is described without the client it
		// secures, so that the config loader can name it.
		{"./transfer/agentclient/agenttls", []string{"/transfer/agentclient", "/server", "/kvmanager", "/internal/daemon", "/internal/config"}},
	} {
		deps := depsOf(t, tt.pkg)
		for _, f := range tt.forbidden {
			if slices.Contains(deps, module+f) {
				t.Errorf("%s links %s%s (forbidden)", tt.pkg, module, f)
			}
		}
	}
}

// TestRegistryDependsOnNoManager keeps the prefill registry below the room
// manager: it emits events that kvmanager applies, so it must never import
// kvmanager (its parent) nor, as a domain package, gRPC or the generated API.
func TestRegistryDependsOnNoManager(t *testing.T) {
	deps := depsOf(t, "./kvmanager/registry")
	for _, d := range deps {
		switch {
		case d == module+"/kvmanager":
			t.Errorf("kvmanager/registry links its parent %s (forbidden: the registry never calls the room manager)", d)
		case d == "google.golang.org/grpc" || strings.HasPrefix(d, "google.golang.org/grpc/"),
			d == module+"/proto" || strings.HasPrefix(d, module+"/proto/"):
			t.Errorf("kvmanager/registry depends on %s (forbidden: no gRPC, no generated API)", d)
		}
	}
}

// TestKVLayoutIsALeaf keeps what every layer shares (the decode geometry,
// the configuration problems, the field error, the clock) at the bottom of
// the tree: kvlayout links no package of this module but itself and nothing
// outside the standard library.
func TestKVLayoutIsALeaf(t *testing.T) {
	for _, d := range depsOf(t, "./kvlayout") {
		if d != module+"/kvlayout" && (d == module || strings.HasPrefix(d, module+"/")) {
			t.Errorf("kvlayout links %s (forbidden: it is a leaf of the module)", d)
		}
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./kvlayout").Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps ./kvlayout: %v\n%s", err, stderr)
	}
	for _, d := range strings.Fields(string(out)) {
		if d != module+"/kvlayout" {
			t.Errorf("kvlayout depends on %s (forbidden: standard library only)", d)
		}
	}
}

// TestRoomIsPure keeps the room state machine (kvmanager/room) and the rank
// plan it reads (kvmanager/ranks) free of what their executor owns: they
// import nothing with a lock, a clock, a context, the allocator, the
// registry, an engine or gRPC, and their code starts no goroutine, holds no
// channel and reads no time but the one each event carries. The allocator
// (prealloc) likewise reads no time at all (its one lock is a leaf, for the
// capacity readers).
func TestRoomIsPure(t *testing.T) {
	allowed := map[string]bool{
		"errors": true, "fmt": true, "math/bits": true, "slices": true, "sort": true, "strconv": true, "strings": true, "time": true,
		module + "/kvlayout": true, module + "/kvmanager/ranks": true, module + "/transfer": true,
	}
	for _, pkg := range []string{"./kvmanager/room", "./kvmanager/ranks"} {
		out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", pkg).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", pkg, err)
		}
		imports := strings.Fields(string(out))
		if len(imports) == 0 {
			t.Fatalf("go list %s listed no imports: it proves nothing", pkg)
		}
		for _, imp := range imports {
			if !allowed[imp] {
				t.Errorf("%s imports %s (allowed: the standard library's pure packages, kvlayout, kvmanager/ranks, the transfer contract)", pkg, imp)
			}
		}
		checkPureSource(t, pkg, false, false)
	}
	checkPureSource(t, "./prealloc", true, true)
}

// checkPureSource parses the package's non-test files and fails on a
// goroutine, a channel, a select, the sync packages (unless allowSync), or
// a read of the clock (time.Now and its kin; with noTime, any time.Time).
func checkPureSource(t *testing.T, dir string, noTime, allowSync bool) {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Sleep": true, "Tick": true}
	files := 0
	for _, p := range pkgs {
		for _, f := range p.Files {
			files++
			for _, imp := range f.Imports {
				if path := strings.Trim(imp.Path.Value, `"`); (!allowSync && (path == "sync" || path == "sync/atomic")) || path == "context" {
					t.Errorf("%s imports %s", fset.Position(imp.Pos()), path)
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.GoStmt:
					t.Errorf("%s: a goroutine", fset.Position(n.Pos()))
				case *ast.ChanType:
					t.Errorf("%s: a channel", fset.Position(n.Pos()))
				case *ast.SelectStmt:
					t.Errorf("%s: a select", fset.Position(n.Pos()))
				case *ast.SelectorExpr:
					if x, ok := n.X.(*ast.Ident); ok && x.Name == "time" && clock[n.Sel.Name] {
						t.Errorf("%s: time.%s reads the clock", fset.Position(n.Pos()), n.Sel.Name)
					}
					if x, ok := n.X.(*ast.Ident); ok && noTime && x.Name == "time" && n.Sel.Name == "Time" {
						t.Errorf("%s: a time.Time (the allocator keeps no time)", fset.Position(n.Pos()))
					}
				}
				return true
			})
		}
	}
	if files == 0 {
		t.Fatalf("%s: no source file parsed: the check proves nothing", dir)
	}
}

// TestGatewayDoesNotDialTheDaemon keeps the JSON gateway in process: it
// calls the operation table through a client connection of its own
// (server/internal/gateway/local.go), so it imports no network, no
// transport credentials and no in-memory listener, and its code creates
// no gRPC client or server and serves nothing.
func TestGatewayDoesNotDialTheDaemon(t *testing.T) {
	const dir = "./server/internal/gateway"
	out, err := exec.Command("go", "list", "-f", "{{join .Imports \"\\n\"}}", dir).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", dir, err)
	}
	imports := strings.Fields(string(out))
	if !slices.Contains(imports, "google.golang.org/grpc") {
		t.Fatalf("go list %s does not list google.golang.org/grpc among its imports: it proves nothing\n%s", dir, out)
	}
	for _, imp := range imports {
		switch {
		case imp == "net", imp == "google.golang.org/grpc/test/bufconn", imp == module+"/server/internal/pipenet",
			strings.HasPrefix(imp, "google.golang.org/grpc/credentials"), imp == "google.golang.org/grpc/resolver":
			t.Errorf("%s imports %s (forbidden: the gateway dials nothing)", dir, imp)
		}
	}
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi fs.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	forbidden := map[string]bool{"NewClient": true, "Dial": true, "DialContext": true, "NewServer": true, "Serve": true}
	files := 0
	for _, p := range pkgs {
		for _, f := range p.Files {
			files++
			ast.Inspect(f, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok && forbidden[sel.Sel.Name] {
					t.Errorf("%s: %s (the gateway runs the calls in process)", fset.Position(n.Pos()), sel.Sel.Name)
				}
				return true
			})
		}
	}
	if files == 0 {
		t.Fatalf("%s: no source file parsed: the check proves nothing", dir)
	}
}

// TestServerSurfacesImportOneWay keeps server's inbound surfaces apart: the
// operation table (server/internal/ops) imports none of them; each surface
// (the sessions, the JSON gateway, SGLang's HTTP routes) imports no other
// surface and not the server package that composes them; the sessions and
// the HTTP routes run the table's ops, the gateway the services built from
// them (ops.Table.Services), handed to it.
func TestServerSurfacesImportOneWay(t *testing.T) {
	const (
		root     = "/server"
		table    = "/server/internal/ops"
		session  = "/server/internal/session"
		gateway  = "/server/internal/gateway"
		httpboot = "/server/internal/httpboot"
	)
	surfaces := []string{session, gateway, httpboot}
	for _, tt := range []struct {
		pkg       string
		forbidden []string
	}{
		{table, append([]string{root}, surfaces...)},
		{session, []string{root, gateway, httpboot}},
		{gateway, []string{root, session, httpboot}},
		{httpboot, []string{root, session, gateway}},
	} {
		deps := depsOf(t, "."+tt.pkg)
		for _, f := range tt.forbidden {
			if slices.Contains(deps, module+f) {
				t.Errorf(".%s links %s%s (forbidden: the surfaces import the table, never each other nor the server)", tt.pkg, module, f)
			}
		}
		if (tt.pkg == session || tt.pkg == httpboot) && !slices.Contains(deps, module+table) {
			t.Errorf(".%s does not link the operation table %s%s", tt.pkg, module, table)
		}
	}
	deps := depsOf(t, "."+root)
	for _, p := range append([]string{table}, surfaces...) {
		if !slices.Contains(deps, module+p) {
			t.Errorf("the server does not link %s%s, which it composes", module, p)
		}
	}
}

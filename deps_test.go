package decodeplane_test

import (
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

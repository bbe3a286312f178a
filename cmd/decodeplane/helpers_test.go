package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// repoRoot is the module root as seen from this package's directory (where
// go test runs the tests).
const repoRoot = "../.."

// writeConfig writes content to a fresh file and returns its path.
func writeConfig(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "decodeplane.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// benchTestRun runs `decodeplane bench args...` through run, as main does,
// with an environment that configures nothing.
func benchTestRun(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(append([]string{"bench"}, args...), []string{}, &out, &errb)
	return code, out.String(), errb.String()
}

package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// --list lists every scenario and exits 0; an unknown scenario is a usage
// error naming it; binaries missing from --bin are named with how to build
// them, before anything starts.
func TestRunUsage(t *testing.T) {
	var out, errs strings.Builder
	if code := run(context.Background(), []string{"--list"}, &out, &errs); code != exitOK || !strings.Contains(out.String(), "lost-ack\n  fault:  ") {
		t.Fatalf("--list = %d\n%s%s", code, out.String(), errs.String())
	}
	out.Reset()
	errs.Reset()
	if code := run(context.Background(), []string{"lost-ack", "nope"}, &out, &errs); code != exitUsage || !strings.Contains(errs.String(), "unknown scenario nope (known: lost-ack, ") {
		t.Fatalf("unknown scenario = %d\n%s", code, errs.String())
	}
	errs.Reset()
	dir := t.TempDir()
	if code := run(context.Background(), []string{"--bin", dir, "lost-ack"}, &out, &errs); code != exitFailure ||
		!strings.Contains(errs.String(), filepath.Join(dir, "decodeplane")+" is missing") || !strings.Contains(errs.String(), "make build") {
		t.Fatalf("missing binaries = %d\n%s", code, errs.String())
	}
}

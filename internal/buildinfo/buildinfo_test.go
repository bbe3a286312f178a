package buildinfo

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	stamped := func(version, rev, modified string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{Main: debug.Module{Version: version}}
			if rev != "" {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: "vcs.revision", Value: rev},
					debug.BuildSetting{Key: "vcs.modified", Value: modified})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, tt := range []struct {
		name                    string
		version, commit         string
		read                    func() (*debug.BuildInfo, bool)
		wantVersion, wantCommit string
	}{
		{"ldflags win", "v0.4.0", "1a2b3c4", stamped("v9.9.9", "ffffffffff", "false"), "v0.4.0", "1a2b3c4"},
		{"go build in a checkout", "dev", "", stamped("v0.0.0-20261201000000-1a2b3c4d5e6f+dirty", "1a2b3c4d5e6f7a8b", "true"),
			"v0.0.0-20261201000000-1a2b3c4d5e6f+dirty", "1a2b3c4-dirty"},
		{"no VCS stamp", "dev", "", stamped("(devel)", "", ""), DevVersion, "unknown"},
		{"no build info", "", "", none, DevVersion, "unknown"},
		{"tag without commit", "v0.4.0", "", stamped("(devel)", "abcdef0123", "false"), "v0.4.0", "abcdef0"},
	} {
		v, c := resolve(tt.version, tt.commit, tt.read)
		if v != tt.wantVersion || c != tt.wantCommit {
			t.Errorf("%s: resolve(%q, %q) = %q, %q; want %q, %q", tt.name, tt.version, tt.commit, v, c, tt.wantVersion, tt.wantCommit)
		}
	}
	if got, want := Line("decodeplane", "v0.4.0", "1a2b3c4"), "decodeplane v0.4.0 (commit 1a2b3c4, "+runtime.Version()+")"; got != want {
		t.Errorf("Line = %q, want %q", got, want)
	}
}

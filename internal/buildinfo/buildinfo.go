// Package buildinfo says which build a binary is: its version (the release
// tag), the commit it was built from and the Go version that built it.
//
// The Makefile sets the version and the commit with -ldflags "-X
// main.version=... -X main.commit=..." (git describe --tags, git rev-parse
// --short HEAD); each command hands its two variables to Resolve. Without
// them (go build, go install) the Go toolchain's VCS stamp is read instead
// (runtime/debug.ReadBuildInfo), and without that the version is
// v0.0.0-dev and the commit unknown.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// DevVersion is the version of a build that has no release tag to name.
const DevVersion = "v0.0.0-dev"

// Resolve returns the version and the commit of this binary: the values
// set at link time when given ("dev" or "" count as not given), else those
// Go stamped into the binary, else DevVersion and "unknown".
func Resolve(version, commit string) (string, string) {
	return resolve(version, commit, debug.ReadBuildInfo)
}

func resolve(version, commit string, read func() (*debug.BuildInfo, bool)) (string, string) {
	if version == "dev" {
		version = ""
	}
	if version == "" || commit == "" {
		if bi, ok := read(); ok {
			if v := bi.Main.Version; version == "" && v != "" && v != "(devel)" {
				version = v
			}
			var rev string
			modified := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if commit == "" && rev != "" {
				commit = rev[:min(len(rev), 7)]
				if modified {
					commit += "-dirty"
				}
			}
		}
	}
	if version == "" {
		version = DevVersion
	}
	if commit == "" {
		commit = "unknown"
	}
	return version, commit
}

// Line is what `NAME version` prints:
// "decodeplane v0.4.0 (commit 1a2b3c4, go1.26.8)".
func Line(name, version, commit string) string {
	return fmt.Sprintf("%s %s (commit %s, %s)", name, version, strings.TrimSpace(commit), runtime.Version())
}

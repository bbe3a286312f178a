package check

import (
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// imageDecodectl is where the image puts decodectl; the preStop drain runs it.
const imageDecodectl = "/usr/local/bin/decodectl"

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
	line int
}

// parseDockerfile splits a Dockerfile into instructions: comments and blank
// lines dropped, lines ending in a backslash joined (the default escape).
func parseDockerfile(t *testing.T, file string) []instruction {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if more, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(trimmed)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args), line: start})
		cur.Reset()
	}
	if cur.Len() != 0 {
		t.Fatalf("%s: the last instruction ends in a line continuation", file)
	}
	return out
}

func TestDockerfile(t *testing.T) {
	file := filepath.Join(repoRoot, "deploy", "container", "Dockerfile")
	ins := parseDockerfile(t, file)
	type stage struct {
		image, name string
		body        []instruction
	}
	var stages []*stage
	for _, in := range ins {
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := &stage{image: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			} else if len(f) != 1 {
				t.Errorf("line %d: FROM %s: want IMAGE [AS NAME]", in.line, in.args)
			}
			stages = append(stages, s)
			continue
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Errorf("line %d: %s before the first FROM", in.line, in.cmd)
			}
			continue
		}
		s := stages[len(stages)-1]
		s.body = append(s.body, in)
		switch in.cmd {
		case "ADD":
			if regexp.MustCompile(`(?i)\b(https?|git)://|git@`).MatchString(in.args) {
				t.Errorf("line %d: ADD of a URL (%s): fetch nothing unpinned at build time", in.line, in.args)
			}
		case "HEALTHCHECK":
			t.Errorf("line %d: HEALTHCHECK: Kubernetes ignores it; the gRPC probes are documented instead", in.line)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a builder and a final stage", len(stages))
	}
	build, final := stages[0], stages[len(stages)-1]
	if !strings.HasPrefix(build.image, "golang:1.26") || build.name == "" {
		t.Errorf("builder stage FROM %s AS %q: want golang:1.26 AS <name>", build.image, build.name)
	}
	buildCmd := ""
	for _, in := range build.body {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			buildCmd = in.args
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-s -w", "./cmd/decodeplane", "./cmd/decodectl"} {
		if !strings.Contains(buildCmd, want) {
			t.Errorf("the go build step %q lacks %q", buildCmd, want)
		}
	}
	if final.image != "gcr.io/distroless/static:nonroot" && final.image != "scratch" {
		t.Errorf("final stage FROM %s: want gcr.io/distroless/static:nonroot or scratch", final.image)
	}

	var user, entrypoint string
	var exposed []int
	copied := map[string]bool{}
	for _, in := range final.body {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "EXPOSE":
			for _, p := range strings.Fields(in.args) {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					t.Errorf("line %d: EXPOSE %s", in.line, p)
				}
				exposed = append(exposed, n)
			}
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) < 3 || f[0] != "--from="+build.name {
				t.Errorf("line %d: COPY %s: the final stage copies only from the builder", in.line, in.args)
				continue
			}
			dst := f[len(f)-1]
			for _, src := range f[1 : len(f)-1] {
				copied[path.Join(dst, path.Base(src))] = true
			}
		case "RUN":
			t.Errorf("line %d: RUN in the final stage: %s has no shell", in.line, final.image)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("final USER %q: want a numeric non-root UID (runAsNonRoot can only verify a number)", user)
	} else if n != 65532 {
		t.Errorf("final USER %d: the manifests' runAsUser is 65532", n)
	}
	var ep []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || !slices.Equal(ep, []string{"/usr/local/bin/decodeplane", "serve"}) {
		t.Errorf("ENTRYPOINT %s: want the exec form [\"/usr/local/bin/decodeplane\", \"serve\"] (%v)", entrypoint, err)
	}
	for _, bin := range []string{ep0(ep), imageDecodectl} {
		if !copied[bin] {
			t.Errorf("the final stage does not put %s in the image (copied: %v)", bin, copied)
		}
	}
	// EXPOSE: the ports of the Kubernetes ConfigMap's listen addresses.
	r := render(t, "standalone")
	c := container(t, &r.deployments[0].Spec.Template.Spec, "decodeplane")
	for _, name := range []string{"grpc", "metrics"} {
		if p := containerPort(t, c, name); !slices.Contains(exposed, int(p)) {
			t.Errorf("EXPOSE %v lacks the %s port %d", exposed, name, p)
		}
	}
}

func ep0(ep []string) string {
	if len(ep) == 0 {
		return ""
	}
	return ep[0]
}

// TestDockerignore: the build context keeps every file the builder's
// `go build` needs (the Go files of every main-module package the binaries
// import, go.mod, go.sum) and drops .git and bin. Patterns are matched as
// Docker does for the forms this file uses: a path prefix, or **/ then a
// base-name glob.
func TestDockerignore(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var patterns []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			if strings.HasPrefix(line, "!") {
				t.Fatalf(".dockerignore: exception %q: teach this check Docker's exception rules first", line)
			}
			patterns = append(patterns, line)
		}
	}
	ignored := func(rel string) bool {
		for _, p := range patterns {
			if base, ok := strings.CutPrefix(p, "**/"); ok {
				for _, seg := range strings.Split(rel, "/") {
					if m, _ := path.Match(base, seg); m {
						return true
					}
				}
				continue
			}
			if m, _ := path.Match(p, rel); m || strings.HasPrefix(rel, p+"/") {
				return true
			}
			if first, _, _ := strings.Cut(rel, "/"); first != rel {
				if m, _ := path.Match(p, first); m {
					return true
				}
			}
		}
		return false
	}
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}`,
		"./cmd/decodeplane", "./cmd/decodectl")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	needed := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(repoRoot, f)
		if err != nil {
			t.Fatal(err)
		}
		needed = append(needed, filepath.ToSlash(rel))
	}
	if len(needed) < 20 {
		t.Fatalf("go list found %d files: the listing is wrong", len(needed))
	}
	for _, f := range needed {
		if ignored(f) {
			t.Errorf(".dockerignore drops %s, which the image's go build needs", f)
		}
	}
	for _, f := range []string{".git/HEAD", "bin/decodeplane", "cmd/decodeplane/e2e_test.go"} {
		if !ignored(f) {
			t.Errorf(".dockerignore keeps %s in the build context", f)
		}
	}
	t.Logf("%d files the build needs are in the context", len(needed))
}

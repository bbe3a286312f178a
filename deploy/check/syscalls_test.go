package check

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSystemdSyscallFilter: every system call `decodeplane serve` makes
// (traced with strace: start, TLS on the listener, sd_notify, a status, a
// scrape of /metrics, a drain, SIGTERM and the graceful stop) is allowed by the unit's
// SystemCallFilter: in @system-service and in none of the groups it denies.
// A call outside it would fail with EPERM under systemd. Skipped without
// strace or systemd-analyze, or where ptrace is not permitted.
func TestSystemdSyscallFilter(t *testing.T) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Skip("strace not found: skipping the system call trace")
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not found: cannot expand the unit's SystemCallFilter groups")
	}
	u := parseUnit(t, filepath.Join(repoRoot, "deploy", "systemd", "decodeplane.service"))
	var allow []string
	var deny []string
	for _, f := range u["Service"]["SystemCallFilter"] {
		if rest, ok := strings.CutPrefix(f, "~"); ok {
			deny = append(deny, strings.Fields(rest)...)
		} else {
			allow = append(allow, strings.Fields(f)...)
		}
	}
	expand := syscallGroups(t, analyze)
	allowed, denied := map[string]bool{}, map[string]string{}
	for _, g := range allow {
		for s := range expand(g) {
			allowed[s] = true
		}
	}
	for _, g := range deny {
		for s := range expand(g) {
			denied[s] = g
		}
	}

	dir := t.TempDir()
	writeTLSFiles(t, dir)
	trace := filepath.Join(dir, "strace.txt")
	addr, metrics := freeAddr(t), freeAddr(t)
	cmd := exec.Command(strace, "-f", "-qq", "-o", trace, "--", binary(t, "decodeplane"), "serve",
		"--config", filepath.Join(repoRoot, "deploy", "systemd", "decodeplane.yaml"),
		"--listen", addr, "--set", "server.metrics_listen="+metrics,
		"--tls-cert", filepath.Join(dir, "tls.crt"), "--tls-key", filepath.Join(dir, "tls.key"))
	// A notification socket, so that the sd_notify calls are traced too.
	notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: filepath.Join(dir, "notify"), Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer notify.Close()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=stand-in",
		"NOTIFY_SOCKET=" + filepath.Join(dir, "notify")}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving, done := make(chan struct{}), make(chan struct{})
	var logs strings.Builder
	var waitErr error
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		once := false
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if !once && strings.Contains(sc.Text(), "decodeplane serving") {
				once = true
				close(serving)
			}
		}
		io.Copy(io.Discard, stderr)
		waitErr = cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill(); <-done })
	select {
	case <-serving:
	case <-done:
		if strings.Contains(logs.String(), "ptrace") || strings.Contains(logs.String(), "Operation not permitted") {
			t.Skipf("strace cannot trace here: %s", logs.String())
		}
		t.Fatalf("the daemon under strace exited before serving (%v):\n%s", waitErr, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatal("the daemon under strace did not serve within 60 s")
	}

	ctlEnv := []string{"PATH=" + os.Getenv("PATH"), "DECODEPLANE_TOKEN=stand-in",
		"DECODEPLANE_TLS_CA=" + filepath.Join(dir, "ca.crt"), "DECODEPLANE_TLS_SERVER_NAME=decodeplane"}
	for _, args := range [][]string{{"status"}, {"drain"}} {
		ctl := exec.Command(binary(t, "decodectl"), append([]string{"--addr", addr}, args...)...)
		ctl.Env = ctlEnv
		if out, err := ctl.CombinedOutput(); err != nil {
			t.Fatalf("decodectl %s: %v\n%s", args, err, out)
		}
	}
	resp, err := http.Get("http://" + metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	buf := make([]byte, 64)
	notify.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := notify.Read(buf); err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("sd_notify under strace: %q %v, want READY=1", buf[:n], err)
	}
	kids, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", cmd.Process.Pid, cmd.Process.Pid))
	if err != nil || len(strings.Fields(string(kids))) != 1 {
		t.Fatalf("the daemon's pid under strace: %q %v", kids, err)
	}
	var pid int
	fmt.Sscan(string(kids), &pid)
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the daemon did not stop within 60 s of SIGTERM")
	}
	if waitErr != nil || !strings.Contains(logs.String(), "decodeplane stopped") {
		t.Fatalf("the traced daemon did not stop cleanly (%v):\n%s", waitErr, logs.String())
	}

	data, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	call := regexp.MustCompile(`^\d+\s+([a-z0-9_]+)\(`)
	used := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := call.FindStringSubmatch(line); m != nil {
			used[m[1]] = true
		}
	}
	if len(used) < 20 {
		t.Fatalf("the trace has %d distinct system calls: it is not a trace of the daemon", len(used))
	}
	var names []string
	for s := range used {
		names = append(names, s)
		if s == "execve" {
			continue // strace's exec of the binary, before systemd's filter would apply
		}
		if !allowed[s] {
			t.Errorf("the daemon calls %s, which SystemCallFilter=%s does not allow", s, strings.Join(allow, " "))
		}
		if g, ok := denied[s]; ok {
			t.Errorf("the daemon calls %s, which SystemCallFilter=~%s denies", s, g)
		}
	}
	slices.Sort(names)
	t.Logf("%d distinct system calls, all allowed by the unit's filter: %s", len(names), strings.Join(names, " "))
}

// syscallGroups returns a function listing a systemd system call group's
// calls, nested groups expanded (systemd-analyze syscall-filter).
func syscallGroups(t *testing.T, analyze string) func(string) map[string]bool {
	cache := map[string]map[string]bool{}
	var expand func(string) map[string]bool
	expand = func(g string) map[string]bool {
		if s, ok := cache[g]; ok {
			return s
		}
		s := map[string]bool{}
		cache[g] = s
		if !strings.HasPrefix(g, "@") {
			s[g] = true
			return s
		}
		out, err := exec.Command(analyze, "syscall-filter", g).Output()
		if err != nil {
			t.Fatalf("systemd-analyze syscall-filter %s: %v", g, err)
		}
		lines := strings.Split(string(out), "\n")
		if len(lines) < 2 || strings.TrimSpace(lines[0]) != g {
			t.Fatalf("systemd-analyze syscall-filter %s: unexpected output:\n%s", g, out)
		}
		for _, l := range lines[1:] {
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			for c := range expand(l) {
				s[c] = true
			}
		}
		return s
	}
	return expand
}

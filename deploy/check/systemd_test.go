package check

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// parseUnit reads a systemd unit: section -> key -> values (a key may repeat).
func parseUnit(t *testing.T, file string) map[string]map[string][]string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	units := map[string]map[string][]string{}
	section := ""
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			units[section] = map[string][]string{}
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" || strings.HasSuffix(line, `\`) {
			t.Fatalf("%s:%d: %q: want Key=value inside a section (no continuations)", file, i+1, line)
		}
		units[section][k] = append(units[section][k], v)
	}
	return units
}

func TestSystemdUnit(t *testing.T) {
	dir := filepath.Join(repoRoot, "deploy", "systemd")
	unitFile := filepath.Join(dir, "decodeplane.service")
	u := parseUnit(t, unitFile)
	svc := u["Service"]
	last := func(k string) string {
		if v := svc[k]; len(v) > 0 {
			return v[len(v)-1]
		}
		return "<unset>"
	}
	for key, want := range map[string]string{
		"Type": "notify", "NotifyAccess": "main",
		"DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
		"NoNewPrivileges": "yes", "CapabilityBoundingSet": "", "AmbientCapabilities": "",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX", "MemoryDenyWriteExecute": "yes",
		"LockPersonality": "yes", "PrivateDevices": "yes", "RestrictRealtime": "yes", "RestrictSUIDSGID": "yes",
		"RestrictNamespaces": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
		"ProtectKernelLogs": "yes", "ProtectControlGroups": "yes", "ProtectClock": "yes",
		"SystemCallArchitectures": "native", "SystemCallErrorNumber": "EPERM", "KillSignal": "SIGTERM",
	} {
		if got := last(key); got != want {
			t.Errorf("[Service] %s=%s, want %q", key, got, want)
		}
	}
	if f := svc["SystemCallFilter"]; len(f) == 0 || f[0] != "@system-service" {
		t.Errorf("SystemCallFilter %q: want @system-service first", f)
	}
	if _, ok := svc["ExecReload"]; ok {
		t.Error("ExecReload: the daemon does not reload on SIGHUP (it would exit)")
	}
	if _, ok := svc["User"]; ok {
		t.Error("User= with DynamicUser=yes")
	}

	// ExecStart runs serve with the sample configuration, which validates.
	exec0 := strings.Fields(last("ExecStart"))
	const sampleConfig = "/etc/decodeplane/decodeplane.yaml"
	if len(exec0) != 4 || exec0[0] != "/usr/local/bin/decodeplane" || exec0[1] != "serve" || exec0[2] != "--config" || exec0[3] != sampleConfig {
		t.Errorf("ExecStart %q: want /usr/local/bin/decodeplane serve --config %s", exec0, sampleConfig)
	}
	sample := filepath.Join(dir, "decodeplane.yaml")
	cmd := exec.Command(binary(t, "decodeplane"), "validate", "--config", sample)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=stand-in"}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("decodeplane validate %s: %v\n%s", sample, err, out)
	}

	// TimeoutStopSec covers server.shutdown_timeout (SIGTERM starts the drain).
	data, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	var cfg daemonConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	shutdown, err := time.ParseDuration(cfg.Server.ShutdownTimeout)
	if err != nil {
		t.Fatalf("%s: server.shutdown_timeout %q must be set: %v", sample, cfg.Server.ShutdownTimeout, err)
	}
	stopSec, err := strconv.Atoi(last("TimeoutStopSec"))
	if err != nil {
		t.Fatalf("TimeoutStopSec=%s: want whole seconds: %v", last("TimeoutStopSec"), err)
	}
	if stop := time.Duration(stopSec) * time.Second; stop <= shutdown {
		t.Errorf("TimeoutStopSec %s <= server.shutdown_timeout %s: systemd would SIGKILL a graceful stop", stop, shutdown)
	}
	if !strings.Contains(last("SuccessExitStatus"), "3") {
		t.Error("SuccessExitStatus lacks 3 (stopped, graceful stop cut short)")
	}

	// systemd-analyze verify, on a copy whose ExecStart is the built binary
	// (verify checks that the executable exists).
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze not found: skipping `systemd-analyze verify`")
		return
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(t.TempDir(), "decodeplane.service")
	if err := os.WriteFile(tmp, []byte(strings.ReplaceAll(string(unit), "/usr/local/bin/decodeplane ", binary(t, "decodeplane")+" ")), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", tmp).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	t.Logf("systemd-analyze verify: clean (%s)", analyze)
}

package check

import (
	"bufio"
	"io"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// TestKubernetesTermination runs each overlay's termination for real: the
// daemon built from the repository serves the ConfigMap's file with the
// container's environment (on a free loopback port instead of 0.0.0.0:7600),
// the preStop command runs as the kubelet would (its --addr pointed at that
// port), the daemon then answers NOT_SERVING (the readiness probe fails, the
// endpoints drop the pod), and SIGTERM stops it with exit 0 within
// server.shutdown_timeout. The etcd overlay's daemon joins a real etcd
// (decodeplane-dev-etcd, built from the repository, on a free loopback
// port): its endpoints are pointed there, and its TLS and authentication
// to etcd are turned off, since the development etcd has neither
// (TestKubernetesOverlays validates them as shipped).
func TestKubernetesTermination(t *testing.T) {
	for name, want := range overlays {
		t.Run(name, func(t *testing.T) {
			r := render(t, name)
			pod := &r.deployments[0].Spec.Template.Spec
			c := container(t, pod, "decodeplane")
			cfgFile, env := podFiles(t, pod, c, r.configMaps[0])
			addr := freeAddr(t)

			args := []string{"serve", "--config", cfgFile, "--listen", addr, "--set", "server.metrics_listen="}
			if want.etcd {
				args = append(args, "--set", "registry.etcd.endpoints="+devEtcd(t), "--set", "registry.etcd.tls.ca_file=", "--set", "registry.etcd.tls.cert_file=",
					"--set", "registry.etcd.tls.key_file=", "--set", "registry.etcd.username=", "--set", "registry.etcd.password_file=")
			}
			daemon := exec.Command(binary(t, "decodeplane"), args...)
			daemon.Env = env
			stderr, err := daemon.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := daemon.Start(); err != nil {
				t.Fatal(err)
			}
			// The reader takes stderr to EOF (the daemon exited), then Wait:
			// Wait closes the pipe, so it must not run before the reads end.
			exited := make(chan error, 1) // the one Wait result
			done := make(chan struct{})   // closed once the daemon exited
			logs := make(chan string, 1)  // its stderr, once it exited
			serving := make(chan struct{})
			go func() {
				defer close(done)
				var all strings.Builder
				sc := bufio.NewScanner(stderr)
				once := false
				for sc.Scan() {
					all.WriteString(sc.Text() + "\n")
					if !once && strings.Contains(sc.Text(), "decodeplane serving") {
						once = true
						close(serving)
					}
				}
				io.Copy(io.Discard, stderr)
				logs <- all.String()
				exited <- daemon.Wait()
			}()
			t.Cleanup(func() {
				daemon.Process.Kill()
				<-done
			})
			select {
			case <-serving:
			case <-exited:
				t.Fatalf("the daemon exited before serving:\n%s", <-logs)
			case <-time.After(30 * time.Second):
				t.Fatal("the daemon did not log serving within 30 s")
			}

			preStop := append([]string(nil), c.Lifecycle.PreStop.Exec.Command...)
			for i := range preStop {
				if i > 0 && preStop[i-1] == "--addr" {
					preStop[i] = addr
				}
			}
			if preStop[0] != imageDecodectl {
				t.Fatalf("preStop %q does not run %s", preStop, imageDecodectl)
			}
			ctl := func(args ...string) string {
				t.Helper()
				cmd := exec.Command(binary(t, "decodectl"), args...)
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("decodectl %q: %v\n%s", args, err, out)
				}
				return string(out)
			}
			if want.etcd {
				// The registry joins etcd (degraded until it has the lease and
				// the view): poll the status for at most 30 s.
				deadline := time.Now().Add(30 * time.Second)
				for out := ctl("--addr", addr, "status"); strings.Contains(out, "registry degraded"); out = ctl("--addr", addr, "status") {
					if time.Now().After(deadline) {
						t.Fatalf("the registry did not reach etcd within 30 s:\n%s", out)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			if out := ctl(preStop[1:]...); !strings.HasPrefix(out, "draining: new rooms are refused (health NOT_SERVING)") {
				t.Errorf("preStop said:\n%s", out)
			}
			if out := ctl("--addr", addr, "status"); !strings.Contains(out, "NOT_SERVING") {
				t.Errorf("after the preStop drain the daemon's health is not NOT_SERVING:\n%s", out)
			}

			if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			var cfg daemonConfig
			shutdown := 30 * time.Second
			if d, err := time.ParseDuration(strings.TrimSpace(cfgShutdown(t, r, &cfg))); err == nil {
				shutdown = d
			}
			select {
			case err := <-exited:
				out := <-logs
				if err != nil {
					t.Errorf("exit after SIGTERM: %v\n%s", err, out)
				}
				if !strings.Contains(out, "decodeplane stopped") {
					t.Errorf("no clean stop in the logs:\n%s", out)
				}
			case <-time.After(shutdown + 5*time.Second):
				t.Fatalf("the daemon did not exit within server.shutdown_timeout %s after SIGTERM", shutdown)
			}
		})
	}
}

func cfgShutdown(t *testing.T, r *rendered, cfg *daemonConfig) string {
	t.Helper()
	if err := yaml.Unmarshal([]byte(r.configMaps[0].Data[configKey]), cfg); err != nil {
		t.Fatal(err)
	}
	return cfg.Server.ShutdownTimeout
}

// devEtcd starts decodeplane-dev-etcd on a free loopback port for t and
// returns its client URL.
func devEtcd(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(binary(t, "decodeplane-dev-etcd"), "--listen", freeAddr(t))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			line <- sc.Text()
		}
		close(line)
		io.Copy(io.Discard, stdout)
	}()
	select {
	case l := <-line:
		// "etcd: <endpoint> data-dir: <dir>"
		f := strings.Fields(l)
		if len(f) < 2 || f[0] != "etcd:" {
			t.Fatalf("decodeplane-dev-etcd printed %q", l)
		}
		return f[1]
	case <-time.After(60 * time.Second):
		t.Fatal("decodeplane-dev-etcd did not serve within 60 s")
	}
	return ""
}

// freeAddr is a loopback address nothing listens on (at the time).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

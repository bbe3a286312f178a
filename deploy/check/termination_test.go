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
// server.shutdown_timeout.
func TestKubernetesTermination(t *testing.T) {
	for name, want := range overlays {
		if want.refused {
			continue
		}
		t.Run(name, func(t *testing.T) {
			r := render(t, name)
			pod := &r.deployments[0].Spec.Template.Spec
			c := container(t, pod, "decodeplane")
			cfgFile, env := podFiles(t, pod, c, r.configMaps[0])
			addr := freeAddr(t)

			daemon := exec.Command(binary(t, "decodeplane"), "serve", "--config", cfgFile, "--listen", addr, "--set", "server.metrics_listen=")
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

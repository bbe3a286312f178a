package check

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// overlays are every overlay under deploy/kubernetes/overlays; a new
// directory there without an entry here fails TestOverlaysListed.
var overlays = map[string]struct {
	tls     bool // components/tls: TLS on the listener, TCP readiness
	sidecar bool // an engine container next to decodeplane
	etcd    bool // registry.backend etcd (the fleet): checked by etcdOverlay too
}{
	"standalone":     {},
	"standalone-tls": {tls: true},
	"sidecar":        {sidecar: true},
	"etcd":           {etcd: true},
}

const configKey = "decodeplane.yaml" // the ConfigMap key holding the file

// ServiceMonitor is the part of the Prometheus Operator's
// monitoring.coreos.com/v1 ServiceMonitor these manifests use, decoded
// strictly: a field outside it fails the check (extend the struct, after
// checking the field in the operator's CRD, to use more).
type ServiceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path,omitempty"`
			Interval      string `json:"interval,omitempty"`
			ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
			Scheme        string `json:"scheme,omitempty"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is one overlay's objects, strictly decoded.
type rendered struct {
	deployments []*appsv1.Deployment
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	pdbs        []*policyv1.PodDisruptionBudget
	netpols     []*networkingv1.NetworkPolicy
	monitors    []*ServiceMonitor
}

// render builds an overlay with kustomize's API and decodes every object
// strictly.
func render(t *testing.T, overlay string) *rendered {
	t.Helper()
	dir := filepath.Join(repoRoot, "deploy", "kubernetes", "overlays", overlay)
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	strict := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	out := &rendered{}
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		what := r.GetKind() + "/" + r.GetName()
		if r.GetKind() == "ServiceMonitor" {
			var sm ServiceMonitor
			if err := yaml.UnmarshalStrict(y, &sm); err != nil {
				t.Errorf("%s: %s: %v", overlay, what, err)
				continue
			}
			if sm.APIVersion != "monitoring.coreos.com/v1" {
				t.Errorf("%s: %s: apiVersion %q, want monitoring.coreos.com/v1", overlay, what, sm.APIVersion)
			}
			out.monitors = append(out.monitors, &sm)
			continue
		}
		obj, _, err := strict.Decode(y, nil, nil)
		if err != nil {
			t.Errorf("%s: %s: strict decode: %v\n%s", overlay, what, err, y)
			continue
		}
		switch o := obj.(type) {
		case *appsv1.Deployment:
			out.deployments = append(out.deployments, o)
		case *corev1.Service:
			out.services = append(out.services, o)
		case *corev1.ConfigMap:
			out.configMaps = append(out.configMaps, o)
		case *policyv1.PodDisruptionBudget:
			out.pdbs = append(out.pdbs, o)
		case *networkingv1.NetworkPolicy:
			out.netpols = append(out.netpols, o)
		default:
			t.Errorf("%s: %s: a kind the checks do not cover (%T): add its invariants", overlay, what, obj)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if len(out.deployments) != 1 || len(out.services) != 1 || len(out.configMaps) != 1 || len(out.pdbs) != 1 ||
		len(out.netpols) != 1 || len(out.monitors) != 1 {
		t.Fatalf("%s: want one Deployment, Service, ConfigMap, PodDisruptionBudget, NetworkPolicy and ServiceMonitor; got %d %d %d %d %d %d",
			overlay, len(out.deployments), len(out.services), len(out.configMaps), len(out.pdbs), len(out.netpols), len(out.monitors))
	}
	return out
}

func TestOverlaysListed(t *testing.T) {
	entries, err := os.ReadDir(filepath.Join(repoRoot, "deploy", "kubernetes", "overlays"))
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for _, e := range entries {
		if e.IsDir() {
			dirs = append(dirs, e.Name())
			if _, ok := overlays[e.Name()]; !ok {
				t.Errorf("overlay %s is not checked: add it to overlays", e.Name())
			}
		}
	}
	for name := range overlays {
		if !slices.Contains(dirs, name) {
			t.Errorf("overlay %s is listed but does not exist", name)
		}
	}
}

// daemonConfig is the part of decodeplane.yaml the manifests depend on.
type daemonConfig struct {
	Server struct {
		Listen          string `json:"listen"`
		MetricsListen   string `json:"metrics_listen"`
		ShutdownTimeout string `json:"shutdown_timeout"`
	} `json:"server"`
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q in the pod", name)
	return nil
}

func containerPort(t *testing.T, c *corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

// listenPort is the port of a host:port listen address; the host must be
// every interface, since the kubelet probes and peers use the pod's IP.
func listenPort(t *testing.T, key, addr string) int32 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", key, addr, err)
	}
	if host != "0.0.0.0" && host != "" && host != "::" {
		t.Errorf("%s = %q: a pod must listen on every interface (0.0.0.0), not %s", key, addr, host)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s %q: port: %v", key, addr, err)
	}
	return int32(n)
}

func TestKubernetesOverlays(t *testing.T) {
	for name, want := range overlays {
		t.Run(name, func(t *testing.T) {
			r := render(t, name)
			dep, svc, cm := r.deployments[0], r.services[0], r.configMaps[0]
			pod := &dep.Spec.Template.Spec
			podLabels := labels.Set(dep.Spec.Template.Labels)
			c := container(t, pod, "decodeplane")

			// The ConfigMap is the file --config names.
			file, ok := cm.Data[configKey]
			if !ok {
				t.Fatalf("ConfigMap %s has no key %s", cm.Name, configKey)
			}
			var cfg daemonConfig
			if err := yaml.Unmarshal([]byte(file), &cfg); err != nil {
				t.Fatalf("ConfigMap %s: %v", cm.Name, err)
			}
			configPath := ""
			for i, a := range c.Args {
				if a == "--config" && i+1 < len(c.Args) {
					configPath = c.Args[i+1]
				}
			}
			mounted := false
			for _, m := range c.VolumeMounts {
				for _, v := range pod.Volumes {
					if v.Name == m.Name && v.ConfigMap != nil && v.ConfigMap.Name == cm.Name && configPath == m.MountPath+"/"+configKey {
						mounted = true
					}
				}
			}
			if !mounted {
				t.Errorf("--config %q is not key %s of ConfigMap %s mounted in the container", configPath, configKey, cm.Name)
			}

			// Ports: the container's named ports are the ConfigMap's listen
			// addresses; the Service and the ServiceMonitor use those names.
			grpcPort := containerPort(t, c, "grpc")
			metricsPort := containerPort(t, c, "metrics")
			if p := listenPort(t, "server.listen", cfg.Server.Listen); p != grpcPort {
				t.Errorf("server.listen %s, containerPort grpc %d", cfg.Server.Listen, grpcPort)
			}
			if p := listenPort(t, "server.metrics_listen", cfg.Server.MetricsListen); p != metricsPort {
				t.Errorf("server.metrics_listen %s, containerPort metrics %d", cfg.Server.MetricsListen, metricsPort)
			}
			if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || len(svc.Spec.Selector) == 0 {
				t.Errorf("Service selector %v does not select the pod %v", svc.Spec.Selector, podLabels)
			}
			svcPorts := map[string]bool{}
			for _, p := range svc.Spec.Ports {
				svcPorts[p.Name] = true
				if tp := p.TargetPort.String(); tp != p.Name || (tp != "grpc" && tp != "metrics") {
					t.Errorf("Service port %s targets %q: want the container port of the same name", p.Name, tp)
				}
			}
			if !svcPorts["grpc"] || !svcPorts["metrics"] {
				t.Errorf("Service ports %v: want grpc and metrics", svcPorts)
			}
			sm := r.monitors[0]
			smSel, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			if err != nil || smSel.Empty() || !smSel.Matches(labels.Set(svc.Labels)) {
				t.Errorf("ServiceMonitor selector %v does not select the Service's labels %v (%v)", sm.Spec.Selector, svc.Labels, err)
			}
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "metrics" || sm.Spec.Endpoints[0].Path != "/metrics" {
				t.Errorf("ServiceMonitor endpoints %+v: want port metrics, path /metrics", sm.Spec.Endpoints)
			}

			// Probes: readiness is the daemon's gRPC health (the kubelet's
			// native probe, which cannot speak TLS); liveness never follows
			// it (NOT_SERVING while draining or waiting for the agent is
			// alive).
			rp, lp := c.ReadinessProbe, c.LivenessProbe
			if rp == nil || lp == nil {
				t.Fatal("the decodeplane container needs a readiness and a liveness probe")
			}
			if want.tls {
				if rp.GRPC != nil || rp.TCPSocket == nil || rp.TCPSocket.Port.String() != "grpc" {
					t.Errorf("with TLS the readiness probe must be tcpSocket on grpc (the kubelet's gRPC probe has no TLS): %+v", rp.ProbeHandler)
				}
			} else if rp.GRPC == nil || rp.GRPC.Port != grpcPort || rp.GRPC.Service == nil || *rp.GRPC.Service != "" {
				t.Errorf("readiness probe %+v: want grpc on port %d, service \"\"", rp.ProbeHandler, grpcPort)
			}
			if lp.GRPC != nil || lp.TCPSocket == nil || lp.TCPSocket.Port.String() != "grpc" {
				t.Errorf("liveness probe %+v: want tcpSocket on port grpc (the daemon's health is readiness)", lp.ProbeHandler)
			}

			// Security.
			psc, sc := pod.SecurityContext, c.SecurityContext
			if psc == nil || sc == nil {
				t.Fatal("pod and container securityContext are required")
			}
			if !(ptrTrue(sc.RunAsNonRoot) || ptrTrue(psc.RunAsNonRoot)) {
				t.Error("runAsNonRoot is not set")
			}
			if uid := firstInt64(sc.RunAsUser, psc.RunAsUser); uid == nil || *uid == 0 {
				t.Errorf("runAsUser %v: want a non-zero UID (the image's 65532)", uid)
			} else if *uid != 65532 {
				t.Errorf("runAsUser %d: the image runs as 65532 (deploy/container/Dockerfile)", *uid)
			}
			if !ptrTrue(sc.ReadOnlyRootFilesystem) {
				t.Error("readOnlyRootFilesystem is not true")
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Error("allowPrivilegeEscalation is not false")
			}
			if sc.Privileged != nil && *sc.Privileged {
				t.Error("privileged")
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("capabilities %+v: want drop ALL, add none", sc.Capabilities)
			}
			seccomp := psc.SeccompProfile
			if sc.SeccompProfile != nil {
				seccomp = sc.SeccompProfile
			}
			if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("seccompProfile %+v: want RuntimeDefault", seccomp)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
			}

			// Drain: preStop runs `decodectl ... --timeout T drain` against
			// the gRPC port, and the grace period covers T and
			// server.shutdown_timeout.
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil {
				t.Fatal("no preStop exec hook")
			}
			cmd := c.Lifecycle.PreStop.Exec.Command
			if len(cmd) == 0 || cmd[0] != imageDecodectl || cmd[len(cmd)-1] != "drain" {
				t.Errorf("preStop %q: want %s ... drain", cmd, imageDecodectl)
			}
			drainTimeout, addr := time.Duration(0), ""
			for i := 0; i+1 < len(cmd); i++ {
				switch cmd[i] {
				case "--timeout":
					drainTimeout, err = time.ParseDuration(cmd[i+1])
					if err != nil {
						t.Errorf("preStop --timeout: %v", err)
					}
				case "--addr":
					addr = cmd[i+1]
				}
			}
			if drainTimeout <= 0 {
				t.Errorf("preStop %q: no --timeout: its time must be bounded to fit the grace period", cmd)
			}
			if addr != net.JoinHostPort("127.0.0.1", strconv.Itoa(int(grpcPort))) {
				t.Errorf("preStop --addr %q: want 127.0.0.1:%d", addr, grpcPort)
			}
			shutdown, err := time.ParseDuration(cfg.Server.ShutdownTimeout)
			if err != nil {
				t.Fatalf("server.shutdown_timeout %q must be set explicitly in the ConfigMap: %v", cfg.Server.ShutdownTimeout, err)
			}
			if pod.TerminationGracePeriodSeconds == nil {
				t.Fatal("terminationGracePeriodSeconds is not set (the default 30 s is below shutdown_timeout + the drain)")
			}
			grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
			if grace < shutdown+drainTimeout {
				t.Errorf("terminationGracePeriodSeconds %s < server.shutdown_timeout %s + preStop drain %s", grace, shutdown, drainTimeout)
			}
			t.Logf("grace %s >= shutdown_timeout %s + preStop drain %s (margin %s)", grace, shutdown, drainTimeout, grace-shutdown-drainTimeout)

			// Disruption and network policy select the pod.
			pdbSel, err := metav1.LabelSelectorAsSelector(r.pdbs[0].Spec.Selector)
			if err != nil || pdbSel.Empty() || !pdbSel.Matches(podLabels) {
				t.Errorf("PodDisruptionBudget selector does not select the pod (%v)", err)
			}
			np := r.netpols[0]
			npSel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil || npSel.Empty() || !npSel.Matches(podLabels) {
				t.Errorf("NetworkPolicy podSelector does not select the pod (%v)", err)
			}
			checkNetworkPolicy(t, np)

			if want.sidecar {
				if len(pod.Containers) != 2 {
					t.Errorf("sidecar: %d containers, want the engine and decodeplane", len(pod.Containers))
				}
				engine := container(t, pod, "decode-engine")
				if !strings.Contains(engine.Image, "REPLACE-ME") {
					t.Errorf("sidecar: engine image %q is not the marked placeholder", engine.Image)
				}
			} else if len(pod.Containers) != 1 {
				t.Errorf("%d containers, want decodeplane alone", len(pod.Containers))
			}

			// The real daemon accepts the ConfigMap with the container's
			// environment.
			if out, code := validateInPod(t, pod, c, cm, nil); code != 0 {
				t.Errorf("decodeplane validate refused the %s overlay's configuration (exit %d):\n%s", name, code, out)
			}
			if want.etcd {
				checkEtcdOverlay(t, pod, c, cm, cfg)
			}
		})
	}
}

func checkNetworkPolicy(t *testing.T, np *networkingv1.NetworkPolicy) {
	t.Helper()
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("NetworkPolicy policyTypes %v: want Ingress", np.Spec.PolicyTypes)
	}
	seen := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || len(rule.From) == 0 {
			t.Errorf("NetworkPolicy rule %+v: want one port and a source", rule)
			continue
		}
		port := rule.Ports[0].Port.String()
		seen[port] = true
		for _, from := range rule.From {
			switch port {
			case "grpc":
				sel, err := metav1.LabelSelectorAsSelector(from.PodSelector)
				if err != nil || from.NamespaceSelector != nil || from.IPBlock != nil {
					t.Errorf("grpc ingress from %+v: want pods of the namespace by label", from)
					continue
				}
				for _, role := range []string{"prefill", "router", "engine"} {
					if !sel.Matches(labels.Set{"decodeplane.io/role": role}) {
						t.Errorf("grpc ingress does not admit role %s", role)
					}
				}
				if sel.Matches(labels.Set{"decodeplane.io/role": "other"}) || sel.Matches(labels.Set{}) {
					t.Error("grpc ingress admits pods that are not prefill, router or engine")
				}
			case "metrics":
				sel, err := metav1.LabelSelectorAsSelector(from.NamespaceSelector)
				if err != nil || from.PodSelector != nil || !sel.Matches(labels.Set{"kubernetes.io/metadata.name": "monitoring"}) ||
					sel.Matches(labels.Set{"kubernetes.io/metadata.name": "default"}) {
					t.Errorf("metrics ingress from %+v: want the monitoring namespace only", from)
				}
			default:
				t.Errorf("NetworkPolicy admits port %s", port)
			}
		}
	}
	if !seen["grpc"] || !seen["metrics"] {
		t.Errorf("NetworkPolicy ports %v: want grpc and metrics", seen)
	}
}

// validateInPod runs `decodeplane validate` (with args, e.g. --explain) on
// the ConfigMap's file with the container's environment (podFiles).
func validateInPod(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, cm *corev1.ConfigMap, args []string) (string, int) {
	t.Helper()
	cfgFile, env := podFiles(t, pod, c, cm)
	cmd := exec.Command(binary(t, "decodeplane"), append([]string{"validate", "--config", cfgFile}, args...)...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatal(err)
		}
		code = ee.ExitCode()
	}
	t.Logf("decodeplane validate %q (exit %d):\n%s", args, code, out)
	return string(out), code
}

// standInPodIP is status.podIP in the environment podFiles builds.
const standInPodIP = "10.0.0.5"

// podFiles writes the ConfigMap's file and the mounted Secrets' files into a
// temporary directory and returns the file and the container's environment
// as the kubelet would build it: literal values with their $(VAR)
// references to earlier variables expanded, values from a Secret replaced
// by a stand-in, status.podIP by standInPodIP. Paths into a mounted Secret,
// in the environment or in the file, point at generated files of the same
// names: tls.crt, tls.key and ca.crt a self-signed certificate, any other
// name (e.g. a password) a stand-in text.
func podFiles(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, cm *corev1.ConfigMap) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	secretMounts := map[string]string{} // mountPath -> local directory
	for _, m := range c.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				local := filepath.Join(dir, v.Secret.SecretName)
				writeTLSFiles(t, local)
				secretMounts[m.MountPath] = local
			}
		}
	}
	// localize points a value's paths into a mounted Secret at the local
	// files, creating a stand-in for a file writeTLSFiles did not write.
	localize := func(v string) string {
		for mount, local := range secretMounts {
			for rest := v; ; {
				i := strings.Index(rest, mount+"/")
				if i < 0 {
					break
				}
				rest = rest[i+len(mount)+1:]
				name := rest[:strings.IndexFunc(rest+" ", func(r rune) bool { return r == ' ' || r == '\n' || r == '"' || r == '\'' || r == ',' })]
				if f := filepath.Join(local, name); name != "" && !strings.Contains(name, "/") {
					if _, err := os.Stat(f); err != nil {
						if err := os.WriteFile(f, []byte("stand-in-for-secret-"+filepath.Base(local)+"-"+name+"\n"), 0o600); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			v = strings.ReplaceAll(v, mount+"/", local+"/")
		}
		return v
	}
	cfgFile := filepath.Join(dir, configKey)
	if err := os.WriteFile(cfgFile, []byte(localize(cm.Data[configKey])), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	defined := map[string]string{}
	for _, e := range c.Env {
		v := expandEnvRefs(e.Value, defined)
		switch {
		case e.ValueFrom == nil:
		case e.ValueFrom.SecretKeyRef != nil:
			v = "stand-in-for-secret-" + e.ValueFrom.SecretKeyRef.Name
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP":
			v = standInPodIP
		default:
			t.Errorf("env %s: a valueFrom the check does not know", e.Name)
		}
		v = localize(v)
		defined[e.Name] = v
		env = append(env, e.Name+"="+v)
	}
	return cfgFile, env
}

// expandEnvRefs expands $(NAME) in an env value as the kubelet does: NAME
// must be defined earlier in the container's env (else the reference stays
// as written), $$ is a literal $.
func expandEnvRefs(v string, defined map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '$' || i+1 == len(v) {
			b.WriteByte(v[i])
			continue
		}
		switch v[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if j := strings.IndexByte(v[i+2:], ')'); j >= 0 {
				name := v[i+2 : i+2+j]
				if val, ok := defined[name]; ok {
					b.WriteString(val)
				} else {
					b.WriteString(v[i : i+3+j])
				}
				i += 2 + j
				continue
			}
		}
		b.WriteByte(v[i])
	}
	return b.String()
}

// writeTLSFiles writes tls.crt, tls.key and ca.crt (a self-signed
// certificate that is its own CA) into dir, as a TLS Secret mounts them.
func writeTLSFiles(t *testing.T, dir string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "decodeplane"},
		DNSNames:  []string{"decodeplane", "decodeplane.decode.svc"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	crt := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"tls.crt": crt, "ca.crt": crt,
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }

func firstInt64(vs ...*int64) *int64 {
	for _, v := range vs {
		if v != nil {
			return v
		}
	}
	return nil
}

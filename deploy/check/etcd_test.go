package check

import (
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// etcdRegistry is the registry section of an etcd overlay's ConfigMap,
// decoded strictly: endpoints must be one string (the daemon's loader has
// no lists), and a key the section does not have fails here before the
// daemon refuses it.
type etcdRegistry struct {
	Registry struct {
		Backend string `json:"backend"`
		Etcd    struct {
			Endpoints        string `json:"endpoints"`
			Prefix           string `json:"prefix"`
			LeaseTTL         string `json:"lease_ttl"`
			AdvertiseAddress string `json:"advertise_address,omitempty"`
			Username         string `json:"username"`
			PasswordFile     string `json:"password_file"`
			TLS              struct {
				CAFile   string `json:"ca_file"`
				CertFile string `json:"cert_file"`
				KeyFile  string `json:"key_file"`
			} `json:"tls"`
		} `json:"etcd"`
	} `json:"registry"`
}

const advertiseEnv = "DECODEPLANE_REGISTRY_ETCD_ADVERTISE_ADDRESS"

// checkEtcdOverlay asserts what a fleet member's pod needs on top of the
// common invariants: the registry on etcd over TLS with a password, every
// file it names in a mounted Secret, its advertise address the pod's own IP
// and gRPC port (downward API, expanded by the kubelet), the daemon reading
// it from there, and the daemon refusing the pod when a piece is missing,
// naming the key.
func checkEtcdOverlay(t *testing.T, pod *corev1.PodSpec, c *corev1.Container, cm *corev1.ConfigMap, cfg daemonConfig) {
	t.Helper()
	var reg etcdRegistry
	if err := yaml.UnmarshalStrict(onlyRegistry(t, cm.Data[configKey]), &reg); err != nil {
		t.Fatalf("registry section of the ConfigMap: %v", err)
	}
	e := reg.Registry.Etcd
	if reg.Registry.Backend != "etcd" {
		t.Errorf("registry.backend %q, want etcd", reg.Registry.Backend)
	}
	eps := strings.Split(e.Endpoints, ",")
	if len(eps) < 3 {
		t.Errorf("registry.etcd.endpoints %q: want the members of an etcd cluster (3 or 5), comma-separated", e.Endpoints)
	}
	for _, ep := range eps {
		if !strings.HasPrefix(ep, "https://") {
			t.Errorf("registry.etcd.endpoints: %q is not https (TLS to etcd)", ep)
		}
	}
	if e.AdvertiseAddress != "" {
		t.Errorf("registry.etcd.advertise_address %q in the ConfigMap: every pod shares it, so every daemon would claim one address; it comes from the pod's IP", e.AdvertiseAddress)
	}

	// Every file the section names is in a Secret mounted read-only.
	secretMount := func(key, path string) {
		t.Helper()
		for _, m := range c.VolumeMounts {
			if !strings.HasPrefix(path, m.MountPath+"/") {
				continue
			}
			for _, v := range pod.Volumes {
				if v.Name == m.Name && v.Secret != nil && m.ReadOnly {
					return
				}
			}
		}
		t.Errorf("%s %q is not in a Secret mounted read-only in the container", key, path)
	}
	if e.Username == "" || e.PasswordFile == "" {
		t.Errorf("registry.etcd.username %q, password_file %q: want etcd authentication with the password from a Secret", e.Username, e.PasswordFile)
	} else {
		secretMount("registry.etcd.password_file", e.PasswordFile)
	}
	for key, path := range map[string]string{"registry.etcd.tls.ca_file": e.TLS.CAFile, "registry.etcd.tls.cert_file": e.TLS.CertFile, "registry.etcd.tls.key_file": e.TLS.KeyFile} {
		if path == "" {
			t.Errorf("%s is not set: want TLS to etcd with a client certificate", key)
			continue
		}
		secretMount(key, path)
	}

	// The advertise address: $(POD_IP):<grpc port>, POD_IP from the
	// downward API and defined before the reference (the kubelet expands
	// only earlier variables).
	grpcPort := containerPort(t, c, "grpc")
	names := make([]string, len(c.Env))
	for i, ev := range c.Env {
		names[i] = ev.Name
	}
	ip, adv := slices.Index(names, "POD_IP"), slices.Index(names, advertiseEnv)
	switch {
	case adv < 0:
		t.Errorf("no %s in the container's env", advertiseEnv)
	case ip < 0 || c.Env[ip].ValueFrom == nil || c.Env[ip].ValueFrom.FieldRef == nil || c.Env[ip].ValueFrom.FieldRef.FieldPath != "status.podIP":
		t.Errorf("POD_IP is not the downward API's status.podIP: %+v", c.Env)
	case ip > adv:
		t.Errorf("POD_IP (env #%d) is defined after %s (env #%d): the kubelet would leave $(POD_IP) unexpanded", ip, advertiseEnv, adv)
	case c.Env[adv].Value != "$(POD_IP):"+strconv.Itoa(int(grpcPort)):
		t.Errorf("%s = %q, want $(POD_IP):%d (the gRPC containerPort)", advertiseEnv, c.Env[adv].Value, grpcPort)
	}
	if _, port, _ := net.SplitHostPort(cfg.Server.Listen); port != strconv.Itoa(int(grpcPort)) {
		t.Errorf("server.listen %s: the advertised port %d is not the one served", cfg.Server.Listen, grpcPort)
	}

	// The daemon reads it so: the effective value and its source.
	out, code := validateInPod(t, pod, c, cm, []string{"--explain"})
	want := regexp.MustCompile(`(?m)^registry\.etcd\.advertise_address\s+"` + regexp.QuoteMeta(standInPodIP+":"+strconv.Itoa(int(grpcPort))) + `"\s+env ` + advertiseEnv + `$`)
	if code != 0 || !want.MatchString(out) {
		t.Errorf("decodeplane validate --explain (exit %d) does not give registry.etcd.advertise_address = %s:%d from env %s:\n%s", code, standInPodIP, grpcPort, advertiseEnv, out)
	}
	for _, key := range []string{"registry.backend", "registry.etcd.endpoints", "registry.etcd.lease_ttl", "registry.etcd.password_file", "registry.etcd.tls.ca_file"} {
		if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `\s.*\sfile \S`).MatchString(out) {
			t.Errorf("decodeplane validate --explain: %s does not come from the ConfigMap's file", key)
		}
	}

	// Broken pods are refused (exit 2) naming the key.
	for _, tt := range []struct {
		what, key string
		edit      func(c *corev1.Container)
	}{
		{"no advertise address", "registry.etcd.advertise_address", func(c *corev1.Container) {
			c.Env = slices.DeleteFunc(c.Env, func(ev corev1.EnvVar) bool { return ev.Name == advertiseEnv })
		}},
		{"the advertise address on port 0", "registry.etcd.advertise_address", func(c *corev1.Container) {
			for i := range c.Env {
				if c.Env[i].Name == advertiseEnv {
					c.Env[i].Value = "$(POD_IP):0"
				}
			}
		}},
		{"the password Secret not mounted", "registry.etcd.password_file", func(c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(e.PasswordFile, m.MountPath+"/") })
		}},
		{"the etcd TLS Secret not mounted", "registry.etcd.tls.ca_file", func(c *corev1.Container) {
			c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return strings.HasPrefix(e.TLS.CAFile, m.MountPath+"/") })
		}},
	} {
		t.Run(tt.what, func(t *testing.T) {
			broken := c.DeepCopy()
			tt.edit(broken)
			out, code := validateInPod(t, pod, broken, cm, nil)
			if code != 2 || !strings.Contains(out, tt.key) {
				t.Errorf("decodeplane validate with %s: exit %d (want 2), output does not name %s:\n%s", tt.what, code, tt.key, out)
			}
		})
	}
}

// onlyRegistry is the file's registry section alone (the other sections
// are checked by daemonConfig and by the daemon).
func onlyRegistry(t *testing.T, file string) []byte {
	t.Helper()
	var all map[string]any
	if err := yaml.Unmarshal([]byte(file), &all); err != nil {
		t.Fatal(err)
	}
	b, err := yaml.Marshal(map[string]any{"registry": all["registry"]})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

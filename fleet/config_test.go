package fleet

import (
	"strings"
	"testing"
	"time"
)

func validEtcd() Config {
	c := DefaultConfig()
	c.Backend = BackendEtcd
	c.Etcd.Endpoints = "http://127.0.0.1:2379, http://127.0.0.2:2379"
	c.Etcd.AdvertiseAddress = "10.0.0.5:7600"
	return c
}

// TestConfigMemoryNeedsNothing: the default is the memory registry, valid
// with every etcd key empty.
func TestConfigMemoryNeedsNothing(t *testing.T) {
	if err := DefaultConfig().Validate(5 * time.Second); err != nil {
		t.Fatalf("the default registry config: %v", err)
	}
	if got := validEtcd().Etcd.EndpointList(); len(got) != 2 || got[1] != "http://127.0.0.2:2379" {
		t.Fatalf("EndpointList = %q", got)
	}
	if err := validEtcd().Validate(5 * time.Second); err != nil {
		t.Fatalf("a valid etcd config: %v", err)
	}
}

// TestConfigEveryProblemAtOnce: each bad value is named with its key and a
// fix, all in one error.
func TestConfigEveryProblemAtOnce(t *testing.T) {
	c := validEtcd()
	c.Etcd.Endpoints = "127.0.0.1:2379"
	c.Etcd.AdvertiseAddress = "0.0.0.0:7600"
	c.Etcd.Prefix = "decodeplane"
	c.Etcd.LeaseTTL = time.Second
	c.Etcd.RequestTimeout = 0
	c.Etcd.CapacityInterval = time.Millisecond
	c.Etcd.Username = "u"
	c.Etcd.TLS.CertFile = "/nonexistent/cert.pem"
	err := c.Validate(5 * time.Second)
	if err == nil {
		t.Fatal("a bad etcd config validated")
	}
	for _, key := range []string{"registry.etcd.endpoints", "registry.etcd.advertise_address", "registry.etcd.prefix",
		"registry.etcd.lease_ttl", "registry.etcd.request_timeout", "registry.etcd.capacity_interval", "registry.etcd.username",
		"registry.etcd.tls.cert_file"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("the error does not name %s:\n%v", key, err)
		}
	}
	if !strings.Contains(err.Error(), "fix") {
		t.Errorf("the error gives no fix:\n%v", err)
	}
}

// TestConfigLeaseOutlivesHeartbeats: a lease shorter than two heartbeat
// intervals is refused, naming the heartbeat key.
func TestConfigLeaseOutlivesHeartbeats(t *testing.T) {
	c := validEtcd()
	c.Etcd.LeaseTTL = 8 * time.Second
	c.Etcd.RequestTimeout = 2 * time.Second
	err := c.Validate(5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "timeouts.heartbeat_interval") {
		t.Fatalf("lease 8s with heartbeat 5s: %v", err)
	}
	if err := c.Validate(4 * time.Second); err != nil {
		t.Fatalf("lease 8s with heartbeat 4s: %v", err)
	}
}

// TestConfigUnexpandedAdvertise: Kubernetes leaves $(POD_IP) as is when
// POD_IP is defined after the variable that uses it; the daemon says so.
func TestConfigUnexpandedAdvertise(t *testing.T) {
	c := validEtcd()
	c.Etcd.AdvertiseAddress = "$(POD_IP):7600"
	err := c.Validate(5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "registry.etcd.advertise_address") || !strings.Contains(err.Error(), "POD_IP") {
		t.Fatalf("unexpanded advertise address: %v", err)
	}
}

// TestConfigWholeSecondLease: etcd grants leases in seconds; 7.5s is
// refused rather than silently cut to 7s.
func TestConfigWholeSecondLease(t *testing.T) {
	c := validEtcd()
	c.Etcd.LeaseTTL = 30*time.Second + 500*time.Millisecond
	if err := c.Validate(5 * time.Second); err == nil || !strings.Contains(err.Error(), "whole number of seconds") {
		t.Fatalf("lease 30.5s: %v", err)
	}
}

// TestConfigAdvertiseAddress: an address others cannot dial is refused, with
// either registry (memory: only when set).
func TestConfigAdvertiseAddress(t *testing.T) {
	for _, a := range []string{"127.0.0.1:99999", "a b:1", "host", ":7600", "0.0.0.0:7600", "[::]:7600", "10.0.0.1:0", "10.0.0.1:http", "http://10.0.0.1:7600"} {
		c := validEtcd()
		c.Etcd.AdvertiseAddress = a
		if err := c.Validate(5 * time.Second); err == nil || !strings.Contains(err.Error(), "registry.etcd.advertise_address") {
			t.Errorf("etcd, advertise %q: %v", a, err)
		}
		m := DefaultConfig()
		m.Etcd.AdvertiseAddress = a
		if err := m.Validate(5 * time.Second); err == nil {
			t.Errorf("memory, advertise %q: accepted", a)
		}
	}
	for _, a := range []string{"10.0.0.5:7600", "[fd00::1]:7600", "decode-0.decode.svc:7600"} {
		c := validEtcd()
		c.Etcd.AdvertiseAddress = a
		if err := c.Validate(5 * time.Second); err != nil {
			t.Errorf("advertise %q: %v", a, err)
		}
	}
	if err := DefaultConfig().Validate(5 * time.Second); err != nil {
		t.Errorf("memory without an advertise address: %v", err)
	}
}

// TestConfigUnknownBackend names the allowed values.
func TestConfigUnknownBackend(t *testing.T) {
	c := DefaultConfig()
	c.Backend = "zookeeper"
	err := c.Validate(5 * time.Second)
	if err == nil || !strings.Contains(err.Error(), "registry.backend") || !strings.Contains(err.Error(), "memory") || !strings.Contains(err.Error(), "etcd") {
		t.Fatalf("unknown backend: %v", err)
	}
}

// TestKeysRoundTrip: every key the registry writes parses back to its kind
// and address; keys of another shape or prefix are unknown.
func TestKeysRoundTrip(t *testing.T) {
	k := keys{prefix: "/p/"}
	addr := "[::1]:8998/x"
	for _, tc := range []struct {
		key  string
		want keyKind
	}{
		{k.daemon(addr), keyDaemon}, {k.capacity(addr), keyCapacity}, {k.instance(addr), keyInstance},
	} {
		kind, a := k.parse(tc.key)
		if kind != tc.want || a != addr {
			t.Errorf("parse(%q) = %v %q, want %v %q", tc.key, kind, a, tc.want, addr)
		}
	}
	for _, bad := range []string{"/q/daemons/a", "/p/daemons/", "/p/daemons/a/b", "/p/prefills/a/other", "/p/prefills/a/ranks/1/2", "/p/nothing"} {
		if kind, _ := k.parse(bad); kind != keyUnknown {
			t.Errorf("parse(%q) = %v, want unknown", bad, kind)
		}
	}
}

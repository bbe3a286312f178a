package fleet

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Backends of registry.backend.
const (
	BackendMemory = "memory"
	BackendEtcd   = "etcd"
)

// Config is the registry section: where prefill registrations, daemon
// records and capacity live.
type Config struct {
	// Backend is memory (this process only: `make run` needs nothing) or
	// etcd (shared by every daemon of a fleet).
	Backend string     `yaml:"backend"`
	Etcd    EtcdConfig `yaml:"etcd"`
}

// EtcdConfig is registry.etcd.
type EtcdConfig struct {
	// Endpoints are etcd's client URLs, comma-separated
	// ("http://10.0.0.1:2379,http://10.0.0.2:2379"); https:// URLs need tls.
	Endpoints string `yaml:"endpoints"`
	// Prefix is prepended to every key (default "/decodeplane/"): daemons
	// sharing a prefix form one fleet.
	Prefix string `yaml:"prefix"`
	// AdvertiseAddress is the host:port at which prefills, routers and
	// operators reach this daemon's gRPC API: the key of its record
	// (required with etcd). With the memory registry it is optional: when
	// set, it is the address GetFleet and WatchCapacity report.
	AdvertiseAddress string `yaml:"advertise_address"`
	// LeaseTTL is the TTL of every lease the daemon grants: its own (its
	// record and capacity), and a prefill instance's, which lives while the
	// instance heartbeats to any daemon of the fleet. A prefill whose daemon
	// dies must heartbeat to another within it.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// DialTimeout bounds connecting to etcd; RequestTimeout bounds every
	// request (a registration waits at most this long for etcd).
	DialTimeout    time.Duration `yaml:"dial_timeout"`
	RequestTimeout time.Duration `yaml:"request_timeout"`
	// CapacityInterval is the least time between two capacity
	// publications (published only when a figure changed, and at least once
	// per lease_ttl/3); 0 publishes none.
	CapacityInterval time.Duration `yaml:"capacity_interval"`
	// Username and Password are etcd's authentication (both or neither);
	// PasswordFile is read at startup instead of Password.
	Username     string `yaml:"username"`
	Password     string `yaml:"password" secret:"true"`
	PasswordFile string `yaml:"password_file"`
	TLS          TLS    `yaml:"tls"`
}

// TLS is registry.etcd.tls: the client side of etcd's TLS.
type TLS struct {
	// CAFile verifies etcd's certificate (required for https endpoints
	// unless the system roots sign it); CertFile and KeyFile are this
	// daemon's client certificate (etcd's --client-cert-auth), both or
	// neither; ServerName overrides the name checked.
	CAFile     string `yaml:"ca_file"`
	CertFile   string `yaml:"cert_file"`
	KeyFile    string `yaml:"key_file"`
	ServerName string `yaml:"server_name"`
}

// Enabled reports whether any TLS setting is given.
func (t TLS) Enabled() bool {
	return t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// Defaults and bounds.
const (
	DefaultPrefix           = "/decodeplane/"
	DefaultLeaseTTL         = 30 * time.Second
	MinLeaseTTL             = 5 * time.Second
	MaxLeaseTTL             = time.Hour
	DefaultDialTimeout      = 5 * time.Second
	DefaultRequestTimeout   = 5 * time.Second
	MaxTimeout              = time.Minute
	DefaultCapacityInterval = time.Second
	MinCapacityInterval     = 100 * time.Millisecond
	MaxCapacityInterval     = time.Minute
	maxPrefixLen            = 256
)

// DefaultConfig is the memory registry, with etcd's defaults filled in.
func DefaultConfig() Config {
	return Config{Backend: BackendMemory, Etcd: EtcdConfig{Prefix: DefaultPrefix, LeaseTTL: DefaultLeaseTTL,
		DialTimeout: DefaultDialTimeout, RequestTimeout: DefaultRequestTimeout, CapacityInterval: DefaultCapacityInterval}}
}

// EndpointList splits Endpoints.
func (c EtcdConfig) EndpointList() []string {
	var out []string
	for _, e := range strings.Split(c.Endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			out = append(out, e)
		}
	}
	return out
}

// Validate returns every problem of the section at once. heartbeat is the
// effective prefill heartbeat interval (timeouts.heartbeat_interval): a
// lease must outlive two of them.
func (c Config) Validate(heartbeat time.Duration) error {
	var errs []error
	add := func(key string, v any, problem, fix string) {
		errs = append(errs, &kvlayout.ConfigError{Key: key, Value: v, Problem: problem, Fix: fix})
	}
	switch c.Backend {
	case BackendMemory:
		if c.Etcd.AdvertiseAddress != "" {
			checkAdvertise(c.Etcd.AdvertiseAddress, add)
		}
		return errors.Join(errs...)
	case BackendEtcd:
	default:
		add("registry.backend", c.Backend, "unknown registry backend.", "set it to memory (this daemon only, the default) or etcd (shared by a fleet).")
		return errors.Join(errs...)
	}
	e := c.Etcd
	eps := e.EndpointList()
	if len(eps) == 0 {
		add("registry.etcd.endpoints", e.Endpoints, "registry.backend is etcd but no endpoint is given.", "set it to etcd's client URLs, comma-separated (e.g. http://10.0.0.1:2379,http://10.0.0.2:2379).")
	}
	for _, ep := range eps {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			add("registry.etcd.endpoints", ep, "not an etcd client URL.", "give each endpoint as http://host:port or https://host:port.")
		}
	}
	if !strings.HasPrefix(e.Prefix, "/") || !strings.HasSuffix(e.Prefix, "/") || len(e.Prefix) > maxPrefixLen || len(e.Prefix) < 2 {
		add("registry.etcd.prefix", e.Prefix, fmt.Sprintf("must start and end with / and be 2 to %d bytes.", maxPrefixLen), "set it to e.g. /decodeplane/ (daemons sharing a prefix form one fleet).")
	}
	checkAdvertise(e.AdvertiseAddress, add)
	if e.LeaseTTL < MinLeaseTTL || e.LeaseTTL > MaxLeaseTTL {
		add("registry.etcd.lease_ttl", e.LeaseTTL, fmt.Sprintf("out of range (%s..%s).", MinLeaseTTL, MaxLeaseTTL), "set it to how long a prefill may go without a heartbeat reaching any daemon of the fleet, e.g. 30s.")
	} else if e.LeaseTTL%time.Second != 0 {
		add("registry.etcd.lease_ttl", e.LeaseTTL, "etcd leases are granted in whole seconds.", fmt.Sprintf("set it to a whole number of seconds, e.g. %s.", e.LeaseTTL.Round(time.Second)))
	} else if heartbeat > 0 && e.LeaseTTL < 2*heartbeat {
		add("registry.etcd.lease_ttl", e.LeaseTTL, fmt.Sprintf("shorter than two prefill heartbeat intervals (timeouts.heartbeat_interval %s): one late heartbeat would end every prefill's lease.", heartbeat),
			fmt.Sprintf("set it to at least %s (or shorten timeouts.heartbeat_interval).", 2*heartbeat))
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"registry.etcd.dial_timeout", e.DialTimeout}, {"registry.etcd.request_timeout", e.RequestTimeout}} {
		if d.v <= 0 || d.v > MaxTimeout {
			add(d.key, d.v, fmt.Sprintf("out of range (more than 0, at most %s).", MaxTimeout), "set a duration such as 5s.")
		}
	}
	if e.RequestTimeout > 0 && e.LeaseTTL > 0 && e.RequestTimeout > e.LeaseTTL/3 {
		add("registry.etcd.request_timeout", e.RequestTimeout, fmt.Sprintf("longer than a third of registry.etcd.lease_ttl (%s): a slow keepalive would let leases expire.", e.LeaseTTL), fmt.Sprintf("set it to at most %s.", (e.LeaseTTL/3).Truncate(100*time.Millisecond)))
	}
	if e.CapacityInterval != 0 && (e.CapacityInterval < MinCapacityInterval || e.CapacityInterval > MaxCapacityInterval) {
		add("registry.etcd.capacity_interval", e.CapacityInterval, fmt.Sprintf("out of range (0 = off, or %s..%s).", MinCapacityInterval, MaxCapacityInterval), "set it to e.g. 1s.")
	}
	if (e.Username == "") != (e.Password == "" && e.PasswordFile == "") {
		add("registry.etcd.username", e.Username, "etcd authentication needs both a username and a password.", "set registry.etcd.username with registry.etcd.password or registry.etcd.password_file, or neither.")
	}
	if e.Password != "" && e.PasswordFile != "" {
		add("registry.etcd.password_file", e.PasswordFile, "both registry.etcd.password and registry.etcd.password_file are set.", "set one of them.")
	}
	if e.PasswordFile != "" {
		if _, err := os.Stat(e.PasswordFile); err != nil {
			add("registry.etcd.password_file", e.PasswordFile, "cannot be read: "+err.Error(), "point it at a file holding the etcd password.")
		}
	}
	if (e.TLS.CertFile == "") != (e.TLS.KeyFile == "") {
		add("registry.etcd.tls.cert_file", e.TLS.CertFile, "a client certificate needs both cert_file and key_file.", "set both registry.etcd.tls.cert_file and registry.etcd.tls.key_file, or neither.")
	}
	for _, f := range []struct{ key, v string }{{"registry.etcd.tls.ca_file", e.TLS.CAFile}, {"registry.etcd.tls.cert_file", e.TLS.CertFile}, {"registry.etcd.tls.key_file", e.TLS.KeyFile}} {
		if f.v == "" {
			continue
		}
		if _, err := os.Stat(f.v); err != nil {
			add(f.key, f.v, "cannot be read: "+err.Error(), "point it at a PEM file.")
		}
	}
	if e.TLS.Enabled() {
		for _, ep := range eps {
			if strings.HasPrefix(ep, "http://") {
				add("registry.etcd.endpoints", ep, "registry.etcd.tls is set but this endpoint is plain http.", "use https:// endpoints with TLS, or drop the registry.etcd.tls settings.")
			}
		}
	}
	return errors.Join(errs...)
}

// checkAdvertise checks registry.etcd.advertise_address: a host:port others
// can dial (not a wildcard, a port in 1..65535, no blank or URL syntax, no
// unexpanded Kubernetes $(VAR)).
func checkAdvertise(a string, add func(key string, v any, problem, fix string)) {
	const key = "registry.etcd.advertise_address"
	if strings.Contains(a, "$(") {
		add(key, a, "holds an unexpanded $(VAR): on Kubernetes the variable it names must be defined before this one in the container's env.",
			"list POD_IP (from the downward API, status.podIP) before DECODEPLANE_REGISTRY_ETCD_ADVERTISE_ADDRESS=$(POD_IP):7600.")
		return
	}
	host, port, err := net.SplitHostPort(a)
	p, perr := strconv.Atoi(port)
	if err != nil || host == "" || isWildcard(host) || perr != nil || p < 1 || p > 65535 || strings.ContainsAny(host, " \t\r\n/?#@,") {
		add(key, a, "must be the host:port at which prefills, routers and operators reach this daemon (a host name or IP, not a wildcard; a port in 1..65535).",
			"set it to this daemon's reachable address, e.g. 10.0.0.5:7600 (on Kubernetes: $(POD_IP):7600).")
	}
}

func isWildcard(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

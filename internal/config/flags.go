package config

import (
	"flag"
	"fmt"
	"io"
	"strings"
)

// Flags are the configuration flags shared by decodeplane serve and validate:
// --config, the dedicated flags (--listen, --transfer-path, …) and --set
// key=value, each recorded as a FlagSetting so that Load can name the flag a
// value came from.
type Flags struct {
	// Path is --config, or $DECODEPLANE_CONFIG after Parse ("" = the
	// embedded defaults).
	Path string
	// Overrides are the flag settings, in command-line order.
	Overrides Overrides
	// FS is the flag set; a command may add its own flags before Parse.
	FS   *flag.FlagSet
	sets setFlag
}

type setFlag struct{ pairs *[]FlagSetting }

func (s setFlag) String() string { return "" }
func (s setFlag) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", v)
	}
	*s.pairs = append(*s.pairs, FlagSetting{Flag: "--set " + k, Key: strings.TrimSpace(k), Value: val})
	return nil
}

// keyFlag is a flag bound to one configuration key.
type keyFlag struct {
	name, key string
	pairs     *[]FlagSetting
}

func (k keyFlag) String() string { return "" }
func (k keyFlag) Set(v string) error {
	*k.pairs = append(*k.pairs, FlagSetting{Flag: "--" + k.name, Key: k.key, Value: v})
	return nil
}

// boolKeyFlag is a keyFlag that may be given without a value (--reflection).
type boolKeyFlag struct{ keyFlag }

func (boolKeyFlag) IsBoolFlag() bool { return true }

// NewFlags defines the configuration flags on a new flag set named name
// (usage and errors go to stderr).
func NewFlags(name string, stderr io.Writer) *Flags {
	cf := &Flags{FS: flag.NewFlagSet(name, flag.ContinueOnError)}
	cf.FS.SetOutput(stderr)
	cf.sets = setFlag{pairs: &cf.Overrides.Pairs}
	cf.FS.StringVar(&cf.Path, "config", "", "configuration file (YAML); default: $DECODEPLANE_CONFIG, else the embedded defaults")
	for _, kf := range []struct{ name, key, usage string }{
		{"listen", "server.listen", "gRPC listen address (server.listen, default 127.0.0.1:7600)"},
		{"metrics-listen", "server.metrics_listen", "Prometheus /metrics address (server.metrics_listen, default 127.0.0.1:7601; empty disables)"},
		{"transfer-path", "transfer.path", "transfer path: sim or delegate (transfer.path)"},
		{"agent", "transfer.delegate.target", "transfer agent address for the delegate path (transfer.delegate.target)"},
		{"page-owner", "kv_pool.owner", "who allocates the KV pages: daemon (the default: OpenRoom admits and chooses each room's pages) or engine (the decode engine allocates them and declares each room's destination, DeclareDestination) (kv_pool.owner)"},
		{"log-level", "log.level", "log level: debug, info, warn, error (log.level)"},
		{"log-format", "log.format", "log format: text or json (log.format)"},
		{"tls-cert", "server.tls.cert_file", "serve gRPC over TLS with this PEM certificate (server.tls.cert_file)"},
		{"tls-key", "server.tls.key_file", "the PEM private key of --tls-cert (server.tls.key_file)"},
		{"tls-client-ca", "server.tls.client_ca_file", "mutual TLS: verify client certificates against this PEM CA bundle (server.tls.client_ca_file)"},
	} {
		cf.FS.Var(keyFlag{name: kf.name, key: kf.key, pairs: &cf.Overrides.Pairs}, kf.name, kf.usage)
	}
	cf.FS.Var(boolKeyFlag{keyFlag{name: "reflection", key: "server.reflection", pairs: &cf.Overrides.Pairs}}, "reflection", "register gRPC server reflection (server.reflection, default true); --reflection=false turns it off")
	cf.FS.Var(cf.sets, "set", "set any configuration key: --set kv_pool.kind=mla (repeatable)")
	return cf
}

// Parse parses args; without --config, DECODEPLANE_CONFIG in environ names
// the file.
func (cf *Flags) Parse(args, environ []string) error {
	if err := cf.FS.Parse(args); err != nil {
		return err
	}
	if cf.FS.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(cf.FS.Args(), " "))
	}
	if cf.Path == "" {
		for _, kv := range environ {
			if v, ok := strings.CutPrefix(kv, "DECODEPLANE_CONFIG="); ok {
				cf.Path = v
			}
		}
	}
	return nil
}

// SetFlag is a --set key=value flag that appends to pairs (for a command
// with flags of its own, like decodeplane bench).
func SetFlag(pairs *[]FlagSetting) flag.Value { return setFlag{pairs: pairs} }

// Package config is the daemon's configuration loader: the schema (Config,
// one YAML key per leaf), the sources in precedence order (embedded defaults
// < file < DECODEPLANE_* and SGLang's environment variables < flags), the
// provenance of every value (Loaded.Sources), the shared command-line flags
// (Flags) and the problem printer that lists every problem at once with its
// key, value, source and fix. cmd/decodeplane parses the command line with
// it; internal/daemon builds a daemon from a Config.
package config

import (
	"encoding"
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/fleet"
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	"github.com/decodeplane/decodeplane/server"
	"github.com/decodeplane/decodeplane/transfer/agentclient/agenttls"
)

// Config is the daemon's whole configuration: the schema of the YAML file.
// Every leaf is also settable as DECODEPLANE_<KEY> (dots → underscores,
// upper case) and with --set key=value; precedence is
// defaults < file < environment < flags.
//
// AgentTLS is the transfer.delegate.tls section: the agent link's TLS is the
// gRPC layer's (kvmanager must not know gRPC), so it is declared here under
// its full dotted name, which places its keys inside transfer.delegate in the
// file, the environment and --set.
type Config struct {
	Server    server.Config            `yaml:"server"`
	Log       LogConfig                `yaml:"log"`
	Transfer  TransferConfig           `yaml:"transfer"`
	AgentTLS  agenttls.AgentTLSConfig  `yaml:"transfer.delegate.tls"`
	KVPool    kvlayout.PoolConfig      `yaml:"kv_pool"`
	Parallel  kvlayout.ParallelConfig  `yaml:"parallel"`
	Staging   kvlayout.StagingConfig   `yaml:"staging"`
	Admission kvlayout.AdmissionConfig `yaml:"admission"`
	// Model names the served model (optional; kvlayout.ModelConfig).
	Model    kvlayout.ModelConfig    `yaml:"model"`
	Timeouts kvmanager.TimeoutConfig `yaml:"timeouts"`
	DPRank   kvmanager.DPRankConfig  `yaml:"dp_rank"`
	Rooms    kvmanager.RoomsConfig   `yaml:"rooms"`
	Engine   EngineConfig            `yaml:"engine"` // engine.go
	// Release is the deferred release of rooms a prefill may still write
	// into (release.deferred_timeout, kvmanager/drain.go).
	Release kvmanager.ReleaseConfig `yaml:"release"`
	// Registry is where prefill registrations, daemon records and capacity
	// live: memory (this process) or etcd (a fleet; package fleet).
	Registry fleet.Config `yaml:"registry"`
}

// LogConfig configures logging (log).
type LogConfig struct {
	// Level is debug, info, warn or error.
	Level string `yaml:"level"`
	// Format is text or json.
	Format string `yaml:"format"`
}

// DefaultConfig returns the embedded defaults.
func DefaultConfig() Config {
	p := kvlayout.DefaultConfig()
	k := kvmanager.DefaultConfig()
	return Config{
		Server:    server.DefaultConfig(),
		Log:       LogConfig{Level: "info", Format: "text"},
		Transfer:  DefaultTransferConfig(),
		AgentTLS:  agenttls.DefaultAgentTLSConfig(),
		KVPool:    p.Pool,
		Parallel:  p.Parallel,
		Staging:   p.Staging,
		Admission: p.Admission,
		Timeouts:  k.Timeouts,
		DPRank:    k.DPRank,
		Rooms:     k.Rooms,
		Release:   kvmanager.ReleaseConfig{DeferredTimeout: kvmanager.DefaultDeferredTimeout},
		Registry:  fleet.DefaultConfig(),
	}
}

// Decode returns the prealloc view of the configuration.
func (c Config) Decode() kvlayout.Config {
	return kvlayout.Config{Backend: c.Transfer.Backend, Pool: c.KVPool, Parallel: c.Parallel, Staging: c.Staging, Admission: c.Admission, Model: c.Model}
}

// Manager returns the kvmanager view of the configuration.
func (c Config) Manager() kvmanager.Config {
	return kvmanager.Config{Timeouts: c.Timeouts, DPRank: c.DPRank, Rooms: c.Rooms, Release: c.Release}
}

// Validate checks every section and returns every problem at once.
func (c Config) Validate() error {
	var errs []error
	errs = append(errs, c.Server.Validate(), c.AgentTLS.Validate(), c.Decode().Validate(), c.Manager().Validate(), c.Transfer.Validate(), c.Transfer.ValidateFor(c.Decode()), c.Engine.Validate(), c.Registry.Validate(c.heartbeatInterval()))
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		errs = append(errs, &kvlayout.ConfigError{Key: "log.level", Value: c.Log.Level, Problem: "unknown log level.", Fix: "set it to debug, info, warn or error."})
	}
	if !slices.Contains([]string{"text", "json"}, c.Log.Format) {
		errs = append(errs, &kvlayout.ConfigError{Key: "log.format", Value: c.Log.Format, Problem: "unknown log format.", Fix: "set it to text or json."})
	}
	return errors.Join(errs...)
}

// heartbeatInterval is the effective prefill heartbeat interval.
func (c Config) heartbeatInterval() time.Duration {
	iv, _ := c.Timeouts.EffectiveHeartbeat()
	return iv
}

// Warnings collects every section's warnings.
func (c Config) Warnings() []kvlayout.Warning {
	w := c.Decode().Warnings()
	w = append(w, c.Manager().Warnings()...)
	w = append(w, c.Transfer.Warnings()...)
	if c.Server.AuthToken == "" {
		w = append(w, kvlayout.Warning{Key: "server.auth_token", Message: "no bootstrap token: any client can register prefill ranks and mutate rooms (set SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)."})
	} else if !c.Server.TLS.Enabled() {
		w = append(w, kvlayout.Warning{Key: "server.tls", Message: fmt.Sprintf("the bootstrap token is sent in clear text: server.tls is off, so whoever can see the traffic to %s can read the token and use it (set server.tls.cert_file and server.tls.key_file).", c.Server.Listen)})
	}
	return w
}

// setting is one configuration leaf.
type setting struct {
	key    string
	env    string
	index  []int
	typ    reflect.Type
	secret bool
}

var (
	durationType      = reflect.TypeFor[time.Duration]()
	textUnmarshalType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// settings enumerates every leaf of Config, in declaration order.
func settings() []setting {
	var out []setting
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
			if tag == "" || tag == "-" || !f.IsExported() {
				continue
			}
			key := tag
			if prefix != "" {
				key = prefix + "." + tag
			}
			idx := append(slices.Clone(index), i)
			if f.Type.Kind() == reflect.Struct && f.Type != durationType && !reflect.PointerTo(f.Type).Implements(textUnmarshalType) {
				walk(f.Type, key, idx)
				continue
			}
			out = append(out, setting{
				key:    key,
				env:    envOf(key),
				index:  idx,
				typ:    f.Type,
				secret: f.Tag.Get("secret") == "true",
			})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// Loaded is a configuration with the source of every value.
type Loaded struct {
	Config  Config
	Sources map[string]string // key → "default", "file F:L", "env NAME", "flag --x"
	byKey   map[string]setting
	order   []setting
	env     map[string]string // the environment Load was given
}

// sglangEnv maps the SGLang variables operators already set to our keys,
// with SGLang's parsing (srt/environ.py EnvBool/EnvInt/EnvFloat/EnvStr).
var sglangEnv = []struct {
	name, key string
	parse     func(string) (any, error)
}{
	{"SGLANG_DISAGG_STAGING_BUFFER", "staging.enabled", pyBool},
	{"SGLANG_DISAGG_STAGING_POOL_SIZE_MB", "staging.pool_size_mb", pyIntAny},
	{"SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "timeouts.waiting", pyIntSeconds},
	{"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "timeouts.bootstrap", pyIntSeconds},
	{"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "timeouts.heartbeat_interval", pyFloatSeconds},
	{"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "timeouts.heartbeat_max_failures", pyIntAny},
	{"SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "server.auth_token", pyStr},
	{"SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION", "admission.clip_max_new_tokens", pyIntAny},
	{"SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL", "dp_rank.binding_ttl", pyIntSeconds},
	{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "dp_rank.force_query", pyBool},
	// The legacy name first, so the current one wins when both are set.
	{"DISAGGREGATION_TEST_FAILURE_PROB", "transfer.sim.failure_probability", pyFloat},
	{"SGLANG_TEST_DISAGG_FAILURE_PROB", "transfer.sim.failure_probability", pyFloat},
}

// renamedKeys are keys that were renamed, old → new: the old name, in the
// file, as DECODEPLANE_* or with --set, is an error that names the new key
// (as SGLang reports a deprecated argument), never a silent unknown key.
var renamedKeys = map[string]struct{ to, why string }{
	// The value was always gigabytes per second; the name read as gigabits.
	"transfer.sim.bandwidth_gbps": {"transfer.sim.bandwidth_gbytes_per_s", "the value is in gigabytes per second, as it always was; the old name read as gigabits"},
}

// nonConfigEnv are DECODEPLANE_* variables that are not configuration keys.
var nonConfigEnv = []string{"DECODEPLANE_CONFIG", "DECODEPLANE_ADDR", "DECODEPLANE_TOKEN", "DECODEPLANE_TLS_CA", "DECODEPLANE_TLS_CERT", "DECODEPLANE_TLS_KEY", "DECODEPLANE_TLS_SERVER_NAME"}

// Overrides are flag-level settings, applied last.
type Overrides struct {
	// Pairs are key=value settings (from --set and the dedicated flags), with
	// the flag that set them.
	Pairs []FlagSetting
}

// FlagSetting is one key set on the command line.
type FlagSetting struct {
	Flag, Key, Value string
}

// Load builds the configuration from defaults, the file (if path != ""),
// the environment (environ as from os.Environ) and the flag overrides. It
// returns every problem it finds at once; the returned Loaded holds what
// could be parsed, so Validate can still report the rest.
func Load(path string, environ []string, ov Overrides) (*Loaded, error) {
	l := &Loaded{Config: DefaultConfig(), Sources: map[string]string{}, byKey: map[string]setting{}}
	l.order = settings()
	for _, s := range l.order {
		l.byKey[s.key] = s
		l.Sources[s.key] = "default"
	}
	var errs []error
	if path != "" {
		errs = append(errs, l.loadFile(path)...)
	}
	errs = append(errs, l.loadEnv(environ)...)
	for _, f := range ov.Pairs {
		s, ok := l.byKey[f.Key]
		if r, renamed := renamedKeys[f.Key]; !ok && renamed {
			errs = append(errs, fmt.Errorf("flag %s: %s", f.Flag, renamedError(f.Key, r.to, r.why)))
			continue
		}
		if !ok {
			errs = append(errs, fmt.Errorf("flag %s: unknown configuration key %q (see 'decodeplane validate --explain' for every key)", f.Flag, f.Key))
			continue
		}
		if err := l.setString(s, f.Value); err != nil {
			errs = append(errs, fmt.Errorf("flag %s: %s: %w", f.Flag, f.Key, err))
			continue
		}
		l.Sources[f.Key] = "flag " + f.Flag
	}
	return l, errors.Join(errs...)
}

func (l *Loaded) field(s setting) reflect.Value {
	return reflect.ValueOf(&l.Config).Elem().FieldByIndex(s.index)
}

// setString parses a textual value into the setting's type.
func (l *Loaded) setString(s setting, raw string) error {
	v, err := parseValue(s.typ, raw)
	if err != nil {
		return err
	}
	l.field(s).Set(v)
	return nil
}

func parseValue(t reflect.Type, raw string) (reflect.Value, error) {
	v := reflect.New(t).Elem()
	if reflect.PointerTo(t).Implements(textUnmarshalType) {
		if err := v.Addr().Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(raw)); err != nil {
			return v, err
		}
		return v, nil
	}
	s := strings.TrimSpace(raw)
	switch {
	case t == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return v, fmt.Errorf("%q is not a duration (use a unit, e.g. 300s, 1m30s, 20us)", raw)
		}
		v.SetInt(int64(d))
	case t.Kind() == reflect.String:
		v.SetString(raw)
	case t.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			// Also SGLang's spellings, so that every boolean reads the same way.
			pb, perr := pyBool(s)
			if perr != nil {
				return v, fmt.Errorf("%q is not a boolean (use true or false; 1/0, yes/no, y/n also work)", raw)
			}
			b = pb.(bool)
		}
		v.SetBool(b)
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		n, err := strconv.ParseInt(s, 10, t.Bits())
		if err != nil {
			return v, fmt.Errorf("%q is not an integer", raw)
		}
		v.SetInt(n)
	case t.Kind() == reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return v, fmt.Errorf("%q is not a finite number", raw)
		}
		v.SetFloat(f)
	default:
		return v, fmt.Errorf("unsupported setting type %s", t)
	}
	return v, nil
}

// Value renders a key's effective value (secrets redacted).
func (l *Loaded) Value(key string) string {
	s, ok := l.byKey[key]
	if !ok {
		return ""
	}
	v := l.field(s)
	if s.secret {
		if v.String() == "" {
			return `""`
		}
		return "<redacted>"
	}
	return renderValue(v)
}

func renderValue(v reflect.Value) string {
	if m, ok := v.Interface().(encoding.TextMarshaler); ok {
		b, _ := m.MarshalText()
		return string(b)
	}
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.String:
		return strconv.Quote(v.String())
	}
	return fmt.Sprint(v.Interface())
}

// Keys lists every key in declaration order.
func (l *Loaded) Keys() []string {
	out := make([]string, len(l.order))
	for i, s := range l.order {
		out[i] = s.key
	}
	return out
}

// EnvName returns the DECODEPLANE_* variable of a key.
func (l *Loaded) EnvName(key string) string { return l.byKey[key].env }

// pyFloatSyntax is Python's float() literal without inf/nan: decimal digits
// with single underscores only between digits, an optional fraction and an
// optional exponent (no hexadecimal, which Go's ParseFloat would accept).
var pyFloatSyntax = regexp.MustCompile(`^[+-]?(?:\d(?:_?\d)*(?:\.(?:\d(?:_?\d)*)?)?|\.\d(?:_?\d)*)(?:[eE][+-]?\d(?:_?\d)*)?$`)

// shapeWarnings are warnings about a pool setting that does not apply to the
// kind; they are noise when the value is only the built-in default (an MLA
// file layered on the GQA defaults inherits kv_heads: 8).
var shapeWarnings = map[string][]string{
	"kv_pool.kv_heads": {"kv_pool.kv_heads", "kv_pool.head_dim"},
	"kv_pool.swa":      {"kv_pool.swa.window", "kv_pool.swa.total_tokens"},
	"kv_pool.mamba":    {"kv_pool.mamba.state_slots"},
}

// Warnings returns the configuration's warnings, without those about
// settings the operator never set.
func (l *Loaded) Warnings() []kvlayout.Warning {
	var out []kvlayout.Warning
	for _, w := range l.Config.Warnings() {
		if keys, ok := shapeWarnings[w.Key]; ok {
			set := false
			for _, k := range keys {
				set = set || l.Sources[k] != "default"
			}
			if !set {
				continue
			}
		}
		out = append(out, w)
	}
	return out
}

// Has reports whether key is a configuration setting.
func (l *Loaded) Has(key string) bool {
	_, ok := l.byKey[key]
	return ok
}

// Set parses raw as the value of key and records source as where it came
// from (decodeplane bench's own defaults, layered over Load's result).
func (l *Loaded) Set(key, raw, source string) error {
	s, ok := l.byKey[key]
	if !ok {
		return fmt.Errorf("%s is not a configuration key", key)
	}
	if err := l.setString(s, raw); err != nil {
		return err
	}
	l.Sources[key] = source
	return nil
}

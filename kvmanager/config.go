package kvmanager

import (
	"errors"
	"fmt"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// Config is the room manager's configuration: timeouts, DP-rank resolution,
// room retention, deferred release (drain.go; its zero value: no deferral). The yaml tags are the daemon's
// configuration keys.
type Config struct {
	Timeouts TimeoutConfig `yaml:"timeouts"`
	DPRank   DPRankConfig  `yaml:"dp_rank"`
	Rooms    RoomsConfig   `yaml:"rooms"`
	Release  ReleaseConfig `yaml:"release"`
}

// TimeoutConfig bounds every wait of a room (timeouts). Defaults are SGLang's.
type TimeoutConfig struct {
	// Waiting bounds the time from the claim of the destination until all KV
	// landed (SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300s); it also bounds a
	// staged room's scatter completion.
	Waiting time.Duration `yaml:"waiting"`
	// Bootstrap bounds the time from OpenRoom until every required prefill
	// rank claimed the destination (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT,
	// 300s): the same bound the prefill applies to itself, so the decode side
	// fails a room no later than prefill would. SGLang has no decode-side
	// deadline before the destination is sent.
	Bootstrap time.Duration `yaml:"bootstrap"`
	// HeartbeatInterval is how often prefill ranks must heartbeat
	// (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, 5s, floored at 2s as SGLang does).
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"`
	// HeartbeatMaxFailures is how many intervals may be missed before the
	// prefill instance is dead (SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE,
	// 2, floored at 1).
	HeartbeatMaxFailures int `yaml:"heartbeat_max_failures"`
	// PrefillInfoAttempts is how many times a room's prefill registration is
	// checked before the room fails with "Could not fetch prefill parallel
	// info from {addr} after {n} attempts" (SGLang: 15), with back-off
	// 1, 1, 2, 4, 4, ... seconds (PrefillInfoBackoff doubling, capped at
	// PrefillInfoBackoffMax).
	PrefillInfoAttempts   int           `yaml:"prefill_info_attempts"`
	PrefillInfoBackoff    time.Duration `yaml:"prefill_info_backoff"`
	PrefillInfoBackoffMax time.Duration `yaml:"prefill_info_backoff_max"`
	// DPRankResolution bounds the wait for a room's prefill DP rank once the
	// prefill is known (SGLang retries forever; 60s).
	DPRankResolution time.Duration `yaml:"dp_rank_resolution"`
	// Retracted bounds how long a RETRACT room waits to resume (its pages
	// back) and Held how long a REBOOTSTRAP room waits for
	// ContinueGeneration, each from the retraction (SGLang: unbounded; 300s
	// each, the order of an RL weight update; 0 is that default, so that a
	// TimeoutConfig without them stays bounded). Past it the room fails
	// with FailureRetractTimeout.
	Retracted time.Duration `yaml:"retracted"`
	Held      time.Duration `yaml:"held"`
}

// DPRankConfig configures room → prefill DP rank resolution (dp_rank).
type DPRankConfig struct {
	// BindingTTL is how long a BindRoom entry lives
	// (SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL, 120s).
	BindingTTL time.Duration `yaml:"binding_ttl"`
	// ForceQuery disables the room % dp_size fast path and allows a BindRoom
	// that contradicts follow_bootstrap_room
	// (SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK).
	ForceQuery bool `yaml:"force_query"`
}

// RoomsConfig bounds how long finished rooms stay visible (rooms).
type RoomsConfig struct {
	// Retention keeps a finished room for GetRoom/WatchRoom/ListRooms.
	Retention time.Duration `yaml:"retention"`
	// MaxRetained caps the finished rooms kept; the oldest go first. It is
	// split evenly across the decode DP shards (each keeps its share,
	// rounded up).
	MaxRetained int `yaml:"max_retained"`
}

// DefaultConfig returns SGLang's defaults.
func DefaultConfig() Config {
	return Config{
		Timeouts: TimeoutConfig{
			Waiting:               300 * time.Second,
			Bootstrap:             300 * time.Second,
			HeartbeatInterval:     5 * time.Second,
			HeartbeatMaxFailures:  2,
			PrefillInfoAttempts:   15,
			PrefillInfoBackoff:    time.Second,
			PrefillInfoBackoffMax: 4 * time.Second,
			DPRankResolution:      60 * time.Second,
			Retracted:             DefaultParkedTimeout,
			Held:                  DefaultParkedTimeout,
		},
		DPRank: DPRankConfig{BindingTTL: 120 * time.Second},
		Rooms:  RoomsConfig{Retention: 10 * time.Minute, MaxRetained: 10000},
	}
}

// DefaultParkedTimeout is timeouts.retracted's and timeouts.held's default,
// also used when either is 0.
const DefaultParkedTimeout = 300 * time.Second

// SGLang's floors for heartbeat settings (CommonKVManager.__init__).
const (
	minHeartbeatInterval    = 2 * time.Second
	minHeartbeatMaxFailures = 1
)

// EffectiveHeartbeat applies SGLang's floors: max(interval, 2s), max(failures, 1).
func (t TimeoutConfig) EffectiveHeartbeat() (time.Duration, int) {
	return max(t.HeartbeatInterval, minHeartbeatInterval), max(t.HeartbeatMaxFailures, minHeartbeatMaxFailures)
}

// Validate returns every problem at once (errors.Join of *kvlayout.ConfigError).
func (c Config) Validate() error {
	var errs []error
	add := func(key string, val any, problem, fix string) {
		errs = append(errs, &kvlayout.ConfigError{Key: key, Value: val, Problem: problem, Fix: fix})
	}
	positive := []struct {
		key string
		d   time.Duration
		env string
	}{
		{"timeouts.waiting", c.Timeouts.Waiting, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"},
		{"timeouts.bootstrap", c.Timeouts.Bootstrap, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"},
		{"timeouts.heartbeat_interval", c.Timeouts.HeartbeatInterval, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"},
		{"timeouts.prefill_info_backoff", c.Timeouts.PrefillInfoBackoff, ""},
		{"timeouts.prefill_info_backoff_max", c.Timeouts.PrefillInfoBackoffMax, ""},
		{"timeouts.dp_rank_resolution", c.Timeouts.DPRankResolution, ""},
		{"dp_rank.binding_ttl", c.DPRank.BindingTTL, "SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL"},
	}
	for _, p := range positive {
		if p.d <= 0 {
			fix := "set a positive duration such as 300s."
			if p.env != "" {
				fix = fmt.Sprintf("set a positive duration such as 300s (or %s in seconds).", p.env)
			}
			add(p.key, p.d, "must be > 0: every wait of a room is bounded.", fix)
		}
	}
	for _, p := range []struct {
		key string
		d   time.Duration
	}{{"timeouts.retracted", c.Timeouts.Retracted}, {"timeouts.held", c.Timeouts.Held}} {
		if p.d < 0 {
			add(p.key, p.d, "must not be negative: a retracted or held room is always bounded.", fmt.Sprintf("set a positive duration such as 300s, or 0 for the default (%s).", DefaultParkedTimeout))
		}
	}
	if c.Timeouts.HeartbeatMaxFailures < 0 {
		add("timeouts.heartbeat_max_failures", c.Timeouts.HeartbeatMaxFailures, "must not be negative.", "set it to 1 or more (SGLang's default is 2).")
	}
	if c.Timeouts.PrefillInfoAttempts < 1 {
		add("timeouts.prefill_info_attempts", c.Timeouts.PrefillInfoAttempts, "must be >= 1.", "set it to SGLang's 15.")
	}
	if c.Timeouts.PrefillInfoBackoffMax > 0 && c.Timeouts.PrefillInfoBackoffMax < c.Timeouts.PrefillInfoBackoff {
		add("timeouts.prefill_info_backoff_max", c.Timeouts.PrefillInfoBackoffMax, fmt.Sprintf("is below timeouts.prefill_info_backoff (%s).", c.Timeouts.PrefillInfoBackoff), "set the cap at or above the first back-off (SGLang: 1s doubling to 4s).")
	}
	if c.Rooms.Retention < 0 {
		add("rooms.retention", c.Rooms.Retention, "must not be negative.", "set a duration such as 10m, or 0 to forget finished rooms at once.")
	}
	if c.Rooms.MaxRetained < 0 {
		add("rooms.max_retained", c.Rooms.MaxRetained, "must not be negative.", "set it to 0 or more.")
	}
	c.Release.validate(add)
	return errors.Join(errs...)
}

// Warnings returns settings that are valid but adjusted or suspicious.
func (c Config) Warnings() []kvlayout.Warning {
	var w []kvlayout.Warning
	iv, mf := c.Timeouts.EffectiveHeartbeat()
	if iv != c.Timeouts.HeartbeatInterval && c.Timeouts.HeartbeatInterval > 0 {
		w = append(w, kvlayout.Warning{Key: "timeouts.heartbeat_interval", Message: fmt.Sprintf("%s is below SGLang's floor; the effective interval is %s.", c.Timeouts.HeartbeatInterval, iv)})
	}
	if mf != c.Timeouts.HeartbeatMaxFailures && c.Timeouts.HeartbeatMaxFailures >= 0 {
		w = append(w, kvlayout.Warning{Key: "timeouts.heartbeat_max_failures", Message: fmt.Sprintf("%d is below SGLang's floor; the effective value is %d.", c.Timeouts.HeartbeatMaxFailures, mf)})
	}
	return w
}

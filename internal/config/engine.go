package config

import (
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

// EngineConfig is the decode engine's side of the daemon (engine).
type EngineConfig struct {
	// ResyncTimeout is how long a daemon that just started waits for the
	// decode engine to re-declare the rooms it still runs (Rooms.Resync)
	// before it admits anything: rooms may be opened and queue meanwhile,
	// nothing is pre-allocated. When it expires the daemon admits with the
	// pool less what was declared, with a warning and
	// decodeplane_resync_expired_total. 0 (the default, for `make run`)
	// admits at once, and a Resync is then refused.
	ResyncTimeout time.Duration `yaml:"resync_timeout"`
}

// MaxResyncTimeout bounds engine.resync_timeout.
const MaxResyncTimeout = time.Hour

// Validate checks the engine section.
func (e EngineConfig) Validate() error {
	if e.ResyncTimeout < 0 || e.ResyncTimeout > MaxResyncTimeout {
		return &kvlayout.ConfigError{Key: "engine.resync_timeout", Value: e.ResyncTimeout.String(), Problem: "out of range.",
			Fix: "set it to 0 (admit at once) or to how long the decode engine may take to re-declare its running rooms after a restart, at most 1h (e.g. 30s)."}
	}
	return nil
}

package config

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// Transfer paths.
const (
	PathSim      = "sim"
	PathDelegate = "delegate"
)

// TransferConfig selects how KV moves (transfer). It is the composition
// root's choice of engine, so it lives with the loader: the room manager
// (kvmanager) only sees the engine it is given.
type TransferConfig struct {
	// Path is "sim" (the embedded simulated engine) or "delegate" (an
	// external transfer agent over gRPC).
	Path string `yaml:"path"`
	// Backend is the engine transfer backend decodeplane stands in for
	// (mooncake, nixl, ascend, mori, fake); see kvlayout.TransferBackends.
	Backend string `yaml:"backend"`
	// Sim configures the simulated engine.
	Sim sim.SimConfig `yaml:"sim"`
	// Delegate configures the external transfer agent.
	Delegate delegate.DelegateConfig `yaml:"delegate"`
}

// DefaultTransferConfig is the simulated path at 64 GB/s and 20 µs per
// chunk, and the delegated path's bounds for when it is chosen.
func DefaultTransferConfig() TransferConfig {
	return TransferConfig{Path: PathSim, Backend: "mooncake", Sim: sim.SimConfig{BandwidthGBytesPerS: 64, Latency: 20 * time.Microsecond},
		Delegate: delegate.DelegateConfig{BatchTimeout: 30 * time.Second, HealthInterval: time.Second}}
}

// Validate returns every problem of the transfer section at once
// (errors.Join of *kvlayout.ConfigError).
func (t TransferConfig) Validate() error {
	var errs []error
	add := func(key string, val any, problem, fix string) {
		errs = append(errs, &kvlayout.ConfigError{Key: key, Value: val, Problem: problem, Fix: fix})
	}
	switch t.Path {
	case PathSim:
	case PathDelegate:
		if _, _, err := net.SplitHostPort(t.Delegate.Target); err != nil {
			add("transfer.delegate.target", t.Delegate.Target, "the delegated path needs the transfer agent's address (host:port).", "set transfer.delegate.target, e.g. 127.0.0.1:7700, or use transfer.path: sim.")
		}
		if t.Delegate.BatchTimeout <= 0 {
			add("transfer.delegate.batch_timeout", t.Delegate.BatchTimeout, "must be > 0.", "set a duration such as 30s.")
		}
		if t.Delegate.HealthInterval <= 0 {
			add("transfer.delegate.health_interval", t.Delegate.HealthInterval, "must be > 0.", "set a duration such as 1s.")
		}
	default:
		add("transfer.path", t.Path, "unknown transfer path.", "set transfer.path to sim (simulated transfers) or delegate (an external transfer agent).")
	}
	if t.Sim.BandwidthGBytesPerS < 0 {
		add("transfer.sim.bandwidth_gbytes_per_s", t.Sim.BandwidthGBytesPerS, "must not be negative.", "set it in gigabytes per second (64 by default), or 0 for instant transfers.")
	}
	if t.Sim.Latency < 0 {
		add("transfer.sim.latency", t.Sim.Latency, "must not be negative.", "set a duration such as 20us, or 0.")
	}
	if t.Sim.FailureProbability < 0 || t.Sim.FailureProbability > 1 || t.Sim.FailureProbability != t.Sim.FailureProbability {
		add("transfer.sim.failure_probability", t.Sim.FailureProbability, "must be between 0 and 1.", "set SGLANG_TEST_DISAGG_FAILURE_PROB / transfer.sim.failure_probability to a probability, or 0.")
	}
	return errors.Join(errs...)
}

// Warnings returns transfer settings that are valid but suspicious.
func (t TransferConfig) Warnings() []kvlayout.Warning {
	var w []kvlayout.Warning
	if t.Sim.FailureProbability > 0 && t.Path == PathSim {
		w = append(w, kvlayout.Warning{Key: "transfer.sim.failure_probability", Message: fmt.Sprintf("%.3g of simulated chunks will fail on purpose.", t.Sim.FailureProbability)})
	}
	return w
}

// ValidateFor checks the combinations of the transfer path with the decode
// pool that the daemon cannot serve correctly: no configuration may start
// whose rooms could succeed on state that never moved.
func (t TransferConfig) ValidateFor(dec kvlayout.Config) error {
	if t.Path != PathDelegate {
		return nil
	}
	var errs []error
	for _, st := range dec.Pool.Kind.StateTypes() {
		switch st {
		case kvlayout.StateSWA, kvlayout.StateMamba:
			errs = append(errs, &kvlayout.ConfigError{Key: "transfer.path", Value: t.Path,
				Problem: fmt.Sprintf("the delegated transfer path moves KV pages and the metadata slot, but not the %s state a %s pool needs per request: its rooms would decode on state that never landed.", st, dec.Pool.Kind),
				Fix:     "use transfer.path: sim for this pool, or a KV pool kind without per-request state (mha, gqa, mla, hybrid-mla)."})
		}
	}
	return errors.Join(errs...)
}

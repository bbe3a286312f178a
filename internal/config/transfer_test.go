package config

import (
	"errors"
	"slices"
	"testing"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/transfer/delegate"
	"github.com/decodeplane/decodeplane/transfer/sim"
)

// TestTransferConfigValidate is the transfer section's part of what was
// kvmanager's TestConfigValidate before the section moved here.
func TestTransferConfigValidate(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*TransferConfig)
		wantKeys []string
	}{
		{name: "defaults", mod: func(*TransferConfig) {}},
		{name: "delegate path", mod: func(c *TransferConfig) { c.Path = PathDelegate; c.Delegate.Target = "127.0.0.1:7700" }},
		{
			name: "transfer",
			mod: func(c *TransferConfig) {
				c.Path = PathDelegate
				c.Delegate = delegate.DelegateConfig{Target: "no-port"}
				c.Sim = sim.SimConfig{BandwidthGBytesPerS: -1, Latency: -1, FailureProbability: 2}
			},
			wantKeys: []string{"transfer.delegate.target", "transfer.delegate.batch_timeout", "transfer.delegate.health_interval", "transfer.sim.bandwidth_gbytes_per_s", "transfer.sim.latency", "transfer.sim.failure_probability"},
		},
		{name: "unknown path", mod: func(c *TransferConfig) { c.Path = "rdma" }, wantKeys: []string{"transfer.path"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultTransferConfig()
			tc.mod(&c)
			err := c.Validate()
			var keys []string
			if err != nil {
				for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
					var ce *kvlayout.ConfigError
					if !errors.As(e, &ce) {
						t.Fatalf("Validate() returned %T %v, want *kvlayout.ConfigError", e, e)
					}
					keys = append(keys, ce.Key)
				}
			}
			if !slices.Equal(keys, tc.wantKeys) {
				t.Errorf("Validate() keys = %q, want %q (%v)", keys, tc.wantKeys, err)
			}
		})
	}
}

func TestTransferConfigWarnings(t *testing.T) {
	c := DefaultTransferConfig()
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("Warnings() of the defaults = %v, want none", w)
	}
	c.Sim.FailureProbability = 0.01
	var keys []string
	for _, w := range c.Warnings() {
		keys = append(keys, w.Key)
	}
	if want := []string{"transfer.sim.failure_probability"}; !slices.Equal(keys, want) {
		t.Errorf("Warnings() keys = %q, want %q", keys, want)
	}
	c.Path = PathDelegate // the simulated engine does not run
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("Warnings() on the delegated path = %v, want none", w)
	}
}

// TestTransferConfigValidateFor: the delegated path moves pages and the
// metadata slot only, so it refuses pools with per-request SWA or Mamba
// state; the simulated path and state-free pools (and DSA, which lives in
// the pages) pass.
func TestTransferConfigValidateFor(t *testing.T) {
	for _, tc := range []struct {
		path    string
		kind    kvlayout.Kind
		refused bool
	}{
		{PathDelegate, kvlayout.KindGQA, false},
		{PathDelegate, kvlayout.KindHybridMLA, false},
		{PathDelegate, kvlayout.KindHybridSWA, true},
		{PathDelegate, kvlayout.KindHybridLinear, true},
		{PathSim, kvlayout.KindHybridSWA, false},
		{PathSim, kvlayout.KindHybridLinear, false},
	} {
		c := DefaultTransferConfig()
		c.Path = tc.path
		var dec kvlayout.Config
		dec.Pool.Kind = tc.kind
		err := c.ValidateFor(dec)
		var ce *kvlayout.ConfigError
		switch {
		case !tc.refused && err != nil:
			t.Errorf("%s on %s: ValidateFor = %v, want nil", tc.path, tc.kind, err)
		case tc.refused && (!errors.As(err, &ce) || ce.Key != "transfer.path"):
			t.Errorf("%s on %s: ValidateFor = %v, want a transfer.path problem", tc.path, tc.kind, err)
		}
	}
}

package kvmanager

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name     string
		mod      func(*Config)
		wantKeys []string
	}{
		{name: "defaults", mod: func(*Config) {}},
		{
			name: "every timeout zero",
			mod: func(c *Config) {
				c.Timeouts = TimeoutConfig{PrefillInfoAttempts: 15}
				c.DPRank.BindingTTL = 0
			},
			wantKeys: []string{"timeouts.waiting", "timeouts.bootstrap", "timeouts.heartbeat_interval", "timeouts.prefill_info_backoff", "timeouts.prefill_info_backoff_max", "timeouts.dp_rank_resolution", "dp_rank.binding_ttl"},
		},
		{
			name: "counts and back-off",
			mod: func(c *Config) {
				c.Timeouts.HeartbeatMaxFailures = -1
				c.Timeouts.PrefillInfoAttempts = 0
				c.Timeouts.PrefillInfoBackoffMax = 500 * time.Millisecond
				c.Rooms = RoomsConfig{Retention: -1, MaxRetained: -1}
			},
			wantKeys: []string{"timeouts.heartbeat_max_failures", "timeouts.prefill_info_attempts", "timeouts.prefill_info_backoff_max", "rooms.retention", "rooms.max_retained"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			err := c.Validate()
			var keys []string
			for _, e := range unjoin(err) {
				var ce *kvlayout.ConfigError
				if !errors.As(e, &ce) {
					t.Fatalf("Validate() returned %T %v, want *kvlayout.ConfigError", e, e)
				}
				keys = append(keys, ce.Key)
			}
			if !slices.Equal(keys, tc.wantKeys) {
				t.Errorf("Validate() keys = %q, want %q (%v)", keys, tc.wantKeys, err)
			}
		})
	}
}

func unjoin(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func TestConfigWarningsAndHeartbeatFloors(t *testing.T) {
	c := DefaultConfig()
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("Warnings() of the defaults = %v, want none", w)
	}
	c.Timeouts.HeartbeatInterval = time.Second
	c.Timeouts.HeartbeatMaxFailures = 0
	if iv, mf := c.Timeouts.EffectiveHeartbeat(); iv != 2*time.Second || mf != 1 {
		t.Errorf("EffectiveHeartbeat() = %s, %d; want SGLang's floors 2s, 1", iv, mf)
	}
	var keys []string
	for _, w := range c.Warnings() {
		keys = append(keys, w.Key)
	}
	want := []string{"timeouts.heartbeat_interval", "timeouts.heartbeat_max_failures"}
	if !slices.Equal(keys, want) {
		t.Errorf("Warnings() keys = %q, want %q", keys, want)
	}
}

func TestPrefillInfoBackoff(t *testing.T) {
	// SGLang's delays for counts 0..6: 1, 1, 2, 4, 4, 4, 4 s.
	tc := DefaultConfig().Timeouts
	var got []time.Duration
	for n := range 7 {
		got = append(got, tc.backoff(n))
	}
	want := []time.Duration{time.Second, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}
	if !slices.Equal(got, want) {
		t.Errorf("backoff(0..6) = %v, want %v", got, want)
	}
}

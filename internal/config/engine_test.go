package config

import (
	"strings"
	"testing"
	"time"
)

// TestEngineResyncTimeout: engine.resync_timeout defaults to 0 (admit at
// once), is read from DECODEPLANE_ENGINE_RESYNC_TIMEOUT, and a value out
// of range is refused naming the key and the fix.
func TestEngineResyncTimeout(t *testing.T) {
	if d := DefaultConfig().Engine.ResyncTimeout; d != 0 {
		t.Errorf("default engine.resync_timeout = %v; want 0", d)
	}
	l, err := Load("", []string{"DECODEPLANE_ENGINE_RESYNC_TIMEOUT=45s"}, Overrides{})
	if err != nil || l.Config.Engine.ResyncTimeout != 45*time.Second || !strings.HasPrefix(l.Sources["engine.resync_timeout"], "env") {
		t.Fatalf("Load(env 45s) = %v, %v; want 45s from the environment", l, err)
	}
	for _, bad := range []time.Duration{-time.Second, MaxResyncTimeout + time.Second} {
		c := DefaultConfig()
		c.Engine.ResyncTimeout = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "engine.resync_timeout") || !strings.Contains(err.Error(), "at most 1h") {
			t.Errorf("Validate(resync_timeout %v) = %v; want a problem naming engine.resync_timeout and the fix", bad, err)
		}
	}
	c := DefaultConfig()
	c.Engine.ResyncTimeout = MaxResyncTimeout
	if err := c.Validate(); err != nil {
		t.Errorf("Validate(resync_timeout 1h) = %v", err)
	}
}

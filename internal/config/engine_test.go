package config

import (
	"strings"
	"testing"
	"time"

	"github.com/decodeplane/decodeplane/kvlayout"
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

// TestPageOwnerSources: kv_pool.owner is read from the file, its
// DECODEPLANE_KV_POOL_OWNER variable, --set and its own flag --page-owner,
// in that precedence, case-insensitively (as kv_pool.kind); a value that is
// neither daemon nor engine is refused naming where it came from, the
// setting, the value and what each allowed value is for.
func TestPageOwnerSources(t *testing.T) {
	if o := DefaultConfig().KVPool.Owner; o != kvlayout.OwnerDaemon {
		t.Fatalf("default kv_pool.owner = %s; want daemon", o)
	}
	file := writeConfig(t, "kv_pool:\n  owner: engine\n")
	tests := []struct {
		name    string
		args    []string
		env     []string
		want    kvlayout.Owner
		wantSrc string
	}{
		{"file", []string{"--config", file}, nil, kvlayout.OwnerEngine, "file " + file + ":2"},
		{"environment", nil, []string{"DECODEPLANE_KV_POOL_OWNER=Engine"}, kvlayout.OwnerEngine, "env DECODEPLANE_KV_POOL_OWNER"},
		{"environment over the file", []string{"--config", file}, []string{"DECODEPLANE_KV_POOL_OWNER=daemon"}, kvlayout.OwnerDaemon, "env DECODEPLANE_KV_POOL_OWNER"},
		{"--set", []string{"--set", "kv_pool.owner=engine"}, nil, kvlayout.OwnerEngine, "flag --set kv_pool.owner"},
		{"--page-owner over the environment", []string{"--page-owner", "daemon"}, []string{"DECODEPLANE_KV_POOL_OWNER=engine"}, kvlayout.OwnerDaemon, "flag --page-owner"},
		{"--page-owner", []string{"--page-owner", "engine"}, nil, kvlayout.OwnerEngine, "flag --page-owner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := mustLoadArgs(t, tt.args, tt.env)
			if l.Config.KVPool.Owner != tt.want || l.Sources["kv_pool.owner"] != tt.wantSrc {
				t.Errorf("kv_pool.owner = %s from %q; want %s from %q", l.Config.KVPool.Owner, l.Sources["kv_pool.owner"], tt.want, tt.wantSrc)
			}
			if got := l.Value("kv_pool.owner"); got != `"`+tt.want.String()+`"` && got != tt.want.String() {
				t.Errorf("Value(kv_pool.owner) = %s; want %s", got, tt.want)
			}
		})
	}
	bad := []struct {
		name string
		args []string
		env  []string
		from string
	}{
		{"file", []string{"--config", writeConfig(t, "kv_pool:\n  owner: sglang\n")}, nil, ":2: kv_pool.owner"},
		{"environment", nil, []string{"DECODEPLANE_KV_POOL_OWNER=sglang"}, "env DECODEPLANE_KV_POOL_OWNER"},
		{"--set", []string{"--set", "kv_pool.owner=sglang"}, nil, "flag --set kv_pool.owner"},
		{"--page-owner", []string{"--page-owner", "sglang"}, nil, "flag --page-owner"},
	}
	for _, tt := range bad {
		t.Run("bad "+tt.name, func(t *testing.T) {
			_, err := loadArgs(t, tt.args, tt.env)
			if err == nil {
				t.Fatal("kv_pool.owner sglang was accepted")
			}
			for _, w := range []string{tt.from, `unknown kv_pool.owner "sglang"`, "allowed: daemon, engine", "DeclareDestination"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

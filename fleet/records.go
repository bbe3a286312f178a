package fleet

import (
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/decodeplane/decodeplane/kvmanager"
)

// The key layout under the prefix P (registry.etcd.prefix):
//
//	P daemons/<advertise_address>                      daemonRecord (with its fingerprint), the daemon's lease
//	P capacity/<advertise_address>                     CapacityUpdate (protobuf JSON), the daemon's lease
//	P prefills/<bootstrap_addr>/instance               instanceRecord, the instance's lease (a tombstone once it deregistered)
//	P prefills/<bootstrap_addr>/ranks/<dp>.<cp>.<tp>.<pp>  rankRecord, the instance's lease
//
// Addresses are path-escaped (url.PathEscape), so a key never holds a
// stray "/". Values are JSON: small, readable with etcdctl, and versioned
// by their "v" field.

const recordVersion = 1

type keys struct{ prefix string }

func (k keys) daemon(addr string) string   { return k.prefix + "daemons/" + url.PathEscape(addr) }
func (k keys) capacity(addr string) string { return k.prefix + "capacity/" + url.PathEscape(addr) }
func (k keys) prefills() string            { return k.prefix + "prefills/" }
func (k keys) prefill(addr string) string  { return k.prefills() + url.PathEscape(addr) + "/" }
func (k keys) instance(addr string) string { return k.prefill(addr) + "instance" }
func (k keys) rank(id kvmanager.RankID) string {
	return fmt.Sprintf("%sranks/%d.%d.%d.%d", k.prefill(id.Addr), id.DP, id.CP, id.TP, id.PP)
}

// keyKind is what a key under the prefix names.
type keyKind int

const (
	keyUnknown keyKind = iota
	keyDaemon
	keyCapacity
	keyInstance
	keyRank
)

// parse says what key names and for which address (unescaped).
func (k keys) parse(key string) (keyKind, string) {
	rest, ok := strings.CutPrefix(key, k.prefix)
	if !ok {
		return keyUnknown, ""
	}
	unescape := func(s string) (string, bool) {
		a, err := url.PathUnescape(s)
		return a, err == nil && a != ""
	}
	if a, ok := strings.CutPrefix(rest, "daemons/"); ok {
		if addr, ok := unescape(a); ok && !strings.Contains(a, "/") {
			return keyDaemon, addr
		}
		return keyUnknown, ""
	}
	if a, ok := strings.CutPrefix(rest, "capacity/"); ok {
		if addr, ok := unescape(a); ok && !strings.Contains(a, "/") {
			return keyCapacity, addr
		}
		return keyUnknown, ""
	}
	if a, ok := strings.CutPrefix(rest, "prefills/"); ok {
		esc, tail, ok := strings.Cut(a, "/")
		addr, okA := unescape(esc)
		if !ok || !okA {
			return keyUnknown, ""
		}
		if tail == "instance" {
			return keyInstance, addr
		}
		if strings.HasPrefix(tail, "ranks/") && !strings.Contains(strings.TrimPrefix(tail, "ranks/"), "/") {
			return keyRank, addr
		}
	}
	return keyUnknown, ""
}

// daemonRecord is one decode daemon of the fleet.
type daemonRecord struct {
	V           int       `json:"v"`
	Address     string    `json:"address"`
	Incarnation string    `json:"incarnation"` // 16 hex digits (a JSON number would lose bits)
	Version     string    `json:"version"`
	StartedAt   time.Time `json:"started_at"`
	Lease       int64     `json:"lease"`
	// Layout is the decode KV layout as protobuf JSON (KVLayout).
	Layout json.RawMessage `json:"layout,omitempty"`
	// Fingerprint is what a prefill must match for this daemon to accept
	// its hand-offs, as protobuf JSON (Fingerprint).
	Fingerprint json.RawMessage `json:"fingerprint,omitempty"`
}

func (d daemonRecord) incarnation() uint64 {
	v, _ := strconv.ParseUint(d.Incarnation, 16, 64)
	return v
}

// instanceRecord is one prefill instance: its incarnation (instance_id),
// its lease and who created it.
type instanceRecord struct {
	V             int       `json:"v"`
	Addr          string    `json:"bootstrap_addr"`
	InstanceID    string    `json:"instance_id"`
	Lease         int64     `json:"lease"`
	RegisteredVia string    `json:"registered_via"`
	CreatedAt     time.Time `json:"created_at"`
	// Deregistered, when set, marks the record a tombstone: the instance
	// deregistered (Bootstrap.DeregisterPrefill) for this reason, and its
	// lease is being revoked. No daemon counts it live or re-creates it.
	Deregistered string `json:"deregistered,omitempty"`

	rev int64 // the revision the view holds it at (not stored)
}

// rankRecord is one rank's registration, as RegisterPrefill received it.
type rankRecord struct {
	V                  int                    `json:"v"`
	Addr               string                 `json:"bootstrap_addr"`
	Endpoint           string                 `json:"endpoint"`
	InstanceID         string                 `json:"instance_id"`
	Parallel           kvmanager.ParallelInfo `json:"parallel"`
	PageSize           int                    `json:"page_size"`
	KVDType            string                 `json:"kv_cache_dtype"`
	LoadBalanceMethod  string                 `json:"load_balance_method,omitempty"`
	DSACacheLayerSplit bool                   `json:"dsa_cache_layer_split,omitempty"`
	HTTPPort           int                    `json:"http_port,omitempty"`
	Model              kvmanager.ModelFacts   `json:"model"`
	Via                string                 `json:"via"`

	rev int64 // the revision the view holds it at (not stored)
}

func rankRecordOf(reg kvmanager.Registration, via string) rankRecord {
	return rankRecord{V: recordVersion, Addr: reg.Addr, Endpoint: reg.Endpoint, InstanceID: reg.InstanceID, Parallel: reg.Parallel,
		PageSize: reg.PageSize, KVDType: reg.KVDType, LoadBalanceMethod: reg.LoadBalanceMethod, DSACacheLayerSplit: reg.DSACacheLayerSplit,
		HTTPPort: reg.HTTPPort, Model: reg.Model, Via: via}
}

func (r rankRecord) registration() kvmanager.Registration {
	return kvmanager.Registration{Addr: r.Addr, Endpoint: r.Endpoint, InstanceID: r.InstanceID, Parallel: r.Parallel, PageSize: r.PageSize,
		KVDType: r.KVDType, LoadBalanceMethod: r.LoadBalanceMethod, DSACacheLayerSplit: r.DSACacheLayerSplit, HTTPPort: r.HTTPPort, Model: r.Model}
}

// rankID is the rank a registration names (SGLang's DP group: attn_dp_rank,
// or system_dp_rank when system_dp_size > 1).
func rankID(reg kvmanager.Registration) kvmanager.RankID {
	p := reg.Parallel
	dp := p.AttnDPRank
	if p.SystemDP > 1 {
		dp = p.SystemDPRank
	}
	return kvmanager.RankID{Addr: reg.Addr, DP: dp, CP: p.AttnCPRank, TP: p.AttnTPRank, PP: p.PPRank}
}

// maxValueBytes bounds a value read from etcd: records are written by
// daemons, but a key under the prefix may hold anything.
const maxValueBytes = 64 << 10

func decode[T any](b []byte) (T, error) {
	var v T
	if len(b) > maxValueBytes {
		return v, fmt.Errorf("value of %d bytes exceeds %d", len(b), maxValueBytes)
	}
	err := json.Unmarshal(b, &v)
	return v, err
}

func encode(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("fleet: encode %T: %w", v, err)
	}
	return string(b), nil
}

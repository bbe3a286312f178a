package fleet

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// The fleet's compatibility fingerprints: every daemon publishes its own in
// its record; a registration this daemon refuses for its layout is checked
// against the others', so that the refusal says which daemons would take it
// (or, when none would, what differs on each); GetFleet says which daemons
// can take each prefill instance's KV.

// fingerprint is a daemon's published fingerprint, checked (the wire's
// bounds, and a digest that is the fields' own) and converted.
type fingerprint struct {
	wire *pb.Fingerprint
	fp   kvlayout.Fingerprint
}

// parseFingerprint reads a daemon record's fingerprint; a record without
// one (an older daemon) or with one out of bounds has none.
func parseFingerprint(raw json.RawMessage) (*fingerprint, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	w := &pb.Fingerprint{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, w); err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	kind, err := kvlayout.ParseKind(w.GetKvPoolKind())
	if err != nil {
		return nil, err
	}
	owner, err := kvlayout.ParseOwner(w.GetPageOwner())
	if err != nil {
		return nil, err
	}
	f := kvlayout.Fingerprint{PageSize: int(w.GetPageSize()), DType: w.GetKvCacheDtype(), Kind: kind, NumLayers: int(w.GetNumLayers()),
		TotalKVHeads: int(w.GetTotalKvHeads()), HeadDim: int(w.GetHeadDim()), KVLoraRank: int(w.GetKvLoraRank()),
		QKRopeHeadDim: int(w.GetQkRopeHeadDim()), Owner: owner, ModelName: w.GetModelName(), ModelRevision: w.GetModelRevision()}
	if d := f.Digest(); d != w.GetDigest() {
		return nil, fmt.Errorf("digest %s is not its fields' (%s)", w.GetDigest(), d)
	}
	return &fingerprint{wire: w, fp: f}, nil
}

// Bounds of what a fleet refusal lists: fingerprints (distinct sets of
// differences), and addresses per fingerprint.
const (
	maxRefusalGroups    = 8
	maxRefusalAddresses = 4
)

// fleetRefusal extends this daemon's refusal of a registration for its
// layout (own, ErrPrefillMismatch) with the fleet: the live daemons that
// would accept it (register through one of them), or, when none would,
// the differences on each. Without another daemon with a fingerprint in
// the view, own is the answer.
func (e *Etcd) fleetRefusal(reg kvmanager.Registration, own error) error {
	type group struct {
		why   string
		addrs []string
	}
	var accept []string
	var groups []*group
	byWhy := map[string]*group{}
	e.mu.Lock()
	for _, addr := range sortedKeys(e.view.fingerprints) {
		if addr == e.cfg.AdvertiseAddress {
			continue
		}
		err := kvmanager.PrefillCompat(reg, e.view.fingerprints[addr].fp)
		if err == nil {
			accept = append(accept, addr)
			continue
		}
		why := strings.TrimPrefix(err.Error(), kvmanager.ErrPrefillMismatch.Error()+": ")
		g := byWhy[why]
		if g == nil {
			g = &group{why: why}
			byWhy[why] = g
			groups = append(groups, g)
		}
		g.addrs = append(g.addrs, addr)
	}
	e.mu.Unlock()
	if len(accept) > 0 {
		return fmt.Errorf("%w; decode daemons of this fleet that accept this prefill: %s (register through one of them)", own, listSome(accept, maxRefusalAddresses))
	}
	if len(groups) == 0 {
		return own
	}
	parts := make([]string, 0, min(len(groups), maxRefusalGroups)+1)
	for i, g := range groups {
		if i == maxRefusalGroups {
			parts = append(parts, fmt.Sprintf("and %d more fingerprints", len(groups)-i))
			break
		}
		parts = append(parts, listSome(g.addrs, maxRefusalAddresses)+": "+g.why)
	}
	return fmt.Errorf("%w; no other live decode daemon of this fleet accepts it either: %s", own, strings.Join(parts, " | "))
}

// listSome joins at most n of list, then "and N more".
func listSome(list []string, n int) string {
	if len(list) <= n {
		return strings.Join(list, ", ")
	}
	return strings.Join(list[:n], ", ") + fmt.Sprintf(" and %d more", len(list)-n)
}

// maxHandOffPairs bounds the (instance, distinct fingerprint) checks of one
// GetFleet.
const maxHandOffPairs = 1_000_000

// handOffs fills each listed prefill's hand_off_digests and refused from
// the daemons' distinct fingerprints (e.mu held). Each instance is checked
// as its first rank on record registered.
func (e *Etcd) handOffs(resp *pb.GetFleetResponse) {
	byDigest := map[string]*fingerprint{}
	for _, d := range resp.GetDaemons() {
		if f := e.view.fingerprints[d.GetAddress()]; f != nil {
			byDigest[f.wire.GetDigest()] = f
		} else if d.GetSelf() && d.GetFingerprint() != nil {
			if f, err := parseFingerprintProto(d.GetFingerprint()); err == nil {
				byDigest[f.wire.GetDigest()] = f
			}
		}
	}
	if len(byDigest) == 0 || len(byDigest)*len(resp.GetPrefills()) > maxHandOffPairs {
		return
	}
	digests := sortedKeys(byDigest)
	for _, p := range resp.GetPrefills() {
		iv := e.view.instances[p.GetBootstrapAddr()]
		if iv == nil {
			continue
		}
		var reg *kvmanager.Registration
		for _, k := range sortedKeys(iv.ranks) {
			if r := iv.ranks[k]; r.InstanceID == iv.rec.InstanceID {
				x := r.registration()
				reg = &x
				break
			}
		}
		if reg == nil {
			continue
		}
		for _, d := range digests {
			err := kvmanager.PrefillCompat(*reg, byDigest[d].fp)
			switch {
			case err == nil:
				p.HandOffDigests = append(p.HandOffDigests, d)
			case errors.Is(err, kvmanager.ErrPrefillMismatch):
				p.Refused = append(p.Refused, &pb.FleetRefusal{Digest: d,
					Differences: strings.TrimPrefix(err.Error(), kvmanager.ErrPrefillMismatch.Error()+": ")})
			default:
				p.Refused = append(p.Refused, &pb.FleetRefusal{Digest: d, Differences: err.Error()})
			}
		}
	}
}

// parseFingerprintProto is parseFingerprint of a message already decoded.
func parseFingerprintProto(w *pb.Fingerprint) (*fingerprint, error) {
	b, err := protojson.Marshal(w)
	if err != nil {
		return nil, err
	}
	return parseFingerprint(b)
}

package kvmanager

import (
	"github.com/decodeplane/decodeplane/kvlayout"
	"github.com/decodeplane/decodeplane/kvmanager/registry"
)

// CheckedRegistration is a registration that passed every check this
// daemon applies before recording it (CheckPrefill).
type CheckedRegistration = registry.Checked

// The calls a shared registry (package fleet, registry.backend etcd) makes
// on the rooms. RegisterPrefill is CheckPrefill then RecordPrefill; the
// fleet publishes the registration to its peers in between, so that a
// registration refused by this daemon is never published, and one the
// fleet could not publish is never recorded here.

// CheckPrefill applies every check of RegisterPrefill that records
// nothing: compatibility with the decode layout, SGLang's rank mapping, the
// rank within its layout, and the layout against the instance's first
// registration.
func (m *Manager) CheckPrefill(reg Registration) (CheckedRegistration, error) {
	c, err := m.reg.Check(reg)
	if err != nil {
		return c, err
	}
	return c, m.reg.Precheck(c)
}

// RecordPrefill records a checked registration and applies what it did to
// the rooms, as RegisterPrefill does.
func (m *Manager) RecordPrefill(c CheckedRegistration) (RegistrationResult, error) {
	res, evs, err := m.reg.Record(c)
	if err != nil {
		return RegistrationResult{}, err
	}
	res.RoomsFailed += m.apply(evs)
	return res, nil
}

// PrefillKnown reports whether reg is already recorded as is (same rank,
// endpoint and instance id): the fleet skips the registrations of its view
// that this daemon recorded itself.
func (m *Manager) PrefillKnown(reg Registration) bool { return m.reg.Known(reg) }

// LosePrefill forgets the prefill instance at addr because its fleet lease
// ended, and fails its rooms still handing off with FailurePrefillLost and
// a message that names reason; it returns how many rooms failed (0 for an
// unknown addr, or when the instance there is not instanceID — a newer one
// replaced it meanwhile; "" matches any).
func (m *Manager) LosePrefill(addr, instanceID, reason string) int {
	return m.apply(m.reg.Lose(addr, instanceID, reason))
}

// DeregisterPrefill forgets the prefill instance at addr because it
// stopped cleanly (Bootstrap.DeregisterPrefill) and fails its rooms still
// handing off with FailurePrefillLost and a message that names reason.
// removed is false when there was nothing to forget: addr unknown, or the
// instance there is not instanceID ("" matches any).
func (m *Manager) DeregisterPrefill(addr, instanceID, reason string) (removed bool, roomsFailed int) {
	evs := m.reg.Lose(addr, instanceID, reason)
	return len(evs) > 0, m.apply(evs)
}

// PrefillCompat checks a registration against a decode pool's fingerprint
// as RegisterPrefill checks it against this daemon's own (registry.Compat):
// nil when that pool can take the prefill's KV, else ErrPrefillMismatch
// naming every difference (or an InvalidError for a kind that is none).
// The fleet asks it of the other daemons' published fingerprints.
func PrefillCompat(reg Registration, fp kvlayout.Fingerprint) error { return registry.Compat(reg, fp) }

// PrefillAddrs lists the addresses of the prefill instances this daemon
// knows, in no order (the fleet compares them with a fresh view).
func (m *Manager) PrefillAddrs() []string { return m.reg.Addrs() }

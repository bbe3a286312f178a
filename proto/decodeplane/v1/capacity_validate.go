package decodeplanev1

import (
	"errors"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
)

// Bounds of WatchCapacityRequest (capacity.proto).
const (
	// DefaultCapacityMinInterval is min_interval when unset or 0.
	DefaultCapacityMinInterval = 100 * time.Millisecond
	// MinCapacityMinInterval and MaxCapacityMinInterval bound min_interval.
	MinCapacityMinInterval = 10 * time.Millisecond
	MaxCapacityMinInterval = 60 * time.Second
	// DefaultCapacityKeepalive is keepalive_interval when unset or 0.
	DefaultCapacityKeepalive = 10 * time.Second
	// MinCapacityKeepalive and MaxCapacityKeepalive bound
	// keepalive_interval, which is also not below min_interval.
	MinCapacityKeepalive = time.Second
	MaxCapacityKeepalive = 10 * time.Minute
)

// Validate implements the validator interceptor's contract: each interval
// within its bounds, keepalive_interval not below min_interval.
func (x *WatchCapacityRequest) Validate() error {
	minI, errMin := capacityInterval("min_interval", x.GetMinInterval(), DefaultCapacityMinInterval, MinCapacityMinInterval, MaxCapacityMinInterval)
	keep, errKeep := capacityInterval("keepalive_interval", x.GetKeepaliveInterval(), DefaultCapacityKeepalive, MinCapacityKeepalive, MaxCapacityKeepalive)
	errs := []error{errMin, errKeep}
	if errMin == nil && errKeep == nil && keep < minI {
		errs = append(errs, fieldErr("keepalive_interval", "%s is below min_interval %s: the keepalive is the most time between two updates, min_interval the least", keep, minI))
	}
	return errors.Join(errs...)
}

// Intervals returns the effective min_interval and keepalive_interval (the
// defaults for unset or 0). Call it on a request that validated.
func (x *WatchCapacityRequest) Intervals() (minInterval, keepalive time.Duration) {
	minInterval, _ = capacityInterval("min_interval", x.GetMinInterval(), DefaultCapacityMinInterval, MinCapacityMinInterval, MaxCapacityMinInterval)
	keepalive, _ = capacityInterval("keepalive_interval", x.GetKeepaliveInterval(), DefaultCapacityKeepalive, MinCapacityKeepalive, MaxCapacityKeepalive)
	return minInterval, keepalive
}

// capacityInterval reads one interval: def when unset or 0, else its value
// within [lo, hi].
func capacityInterval(field string, d *durationpb.Duration, def, lo, hi time.Duration) (time.Duration, error) {
	if d == nil || (d.GetSeconds() == 0 && d.GetNanos() == 0) {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return def, fieldErr(field, "is not a valid duration (%v); allowed %s..%s, or unset for %s", err, lo, hi, def)
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return def, fieldErr(field, "%s is out of range: allowed %s..%s, or unset for %s", v, lo, hi, def)
	}
	return v, nil
}

package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/decodeplane/decodeplane/kvmanager"
)

// DeregisterPrefill removes a prefill instance that stops cleanly
// (Bootstrap.DeregisterPrefill) from the fleet, then from this daemon's
// rooms. In etcd, the instance record is replaced by a tombstone that
// carries reason (conditional on the record read, under the same lease),
// then the lease is revoked, which removes its ranks. Every daemon fails
// its rooms of the instance when the tombstone reaches it, and none
// re-creates the records for ranks that still heartbeat to it (reattach
// skips a deregistered instance). Nothing changes when etcd does not
// answer (kvmanager.ErrRegistryUnavailable: retry); a tombstone whose lease
// could not be revoked leaves with the lease.
func (e *Etcd) DeregisterPrefill(ctx context.Context, addr, instanceID, reason string) (bool, int, error) {
	if degraded, why, since := e.State(); degraded {
		return false, 0, fmt.Errorf("%w: registry degraded since %s (%s): the instance cannot be removed from the fleet until etcd is reachable again; retry",
			kvmanager.ErrRegistryUnavailable, since.UTC().Format(time.RFC3339), why)
	}
	rctx, cancel := e.requestCtx(ctx)
	defer cancel()
	inFleet, err := e.tombstone(rctx, addr, instanceID, reason)
	if err != nil {
		if ctx.Err() != nil {
			return false, 0, ctx.Err()
		}
		e.obs.RegistryError("deregister")
		return false, 0, fmt.Errorf("%w: the deregistration could not be recorded in etcd within registry.etcd.request_timeout %s (%v); retry",
			kvmanager.ErrRegistryUnavailable, e.cfg.RequestTimeout, err)
	}
	e.mu.Lock()
	delete(e.heard, addr) // no longer ours to keep alive
	e.mu.Unlock()
	removed, failed := e.deps.Rooms.DeregisterPrefill(addr, instanceID, reason)
	return removed || inFleet, failed, nil
}

// tombstone marks the instance at addr deregistered in etcd and revokes its
// lease; it reports false when etcd holds no live record of that instance
// (none, already deregistered, or another instance id).
func (e *Etcd) tombstone(ctx context.Context, addr, instanceID, reason string) (bool, error) {
	key := e.keys.instance(addr)
	for range 4 {
		g, err := e.cli.Get(ctx, key)
		if err != nil {
			return false, err
		}
		if len(g.Kvs) != 1 {
			return false, nil
		}
		rec, err := decode[instanceRecord](g.Kvs[0].Value)
		if err != nil || rec.Lease == 0 || rec.Deregistered != "" ||
			(instanceID != "" && rec.InstanceID != "" && rec.InstanceID != instanceID) {
			return false, nil
		}
		rec.Deregistered = reason
		val, err := encode(rec)
		if err != nil {
			return false, err
		}
		lease := clientv3.LeaseID(rec.Lease)
		t, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", g.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, val, clientv3.WithLease(lease))).Commit()
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, nil // the lease ended meanwhile: its records are gone
		}
		if err != nil {
			return false, err
		}
		if !t.Succeeded {
			continue // the record changed under us: read it again
		}
		// This daemon's view holds the tombstone at once (the watch confirms
		// it): its instance is no longer live here.
		e.mu.Lock()
		e.put(&e.view, key, []byte(val), t.Header.Revision)
		e.view.rev = max(e.view.rev, t.Header.Revision)
		e.mu.Unlock()
		if _, err := e.cli.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			e.log.Warn("fleet registry: could not revoke a deregistered prefill instance's lease; its records leave when it expires (every daemon already treats it as gone)",
				"bootstrap_addr", addr, "lease", rec.Lease, "err", err, "lease_ttl", e.cfg.LeaseTTL)
		}
		return true, nil
	}
	return false, errors.New("the prefill instance's record kept changing under concurrent registrations")
}

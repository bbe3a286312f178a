package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/kvmanager"
)

// RegisterPrefill checks a registration as this daemon would record it,
// publishes it to the fleet, then records it here. A registration refused
// here is never published; one that could not be published (etcd
// unreachable, or the registry degraded) is refused with
// kvmanager.ErrRegistryUnavailable (UNAVAILABLE, retry) and recorded
// nowhere. The registration counts as the instance's heartbeat here.
func (e *Etcd) RegisterPrefill(ctx context.Context, reg kvmanager.Registration) (kvmanager.RegistrationResult, error) {
	c, err := e.deps.Rooms.CheckPrefill(reg)
	if errors.Is(err, kvmanager.ErrPrefillMismatch) {
		return kvmanager.RegistrationResult{}, e.fleetRefusal(reg, err)
	}
	if err != nil {
		return kvmanager.RegistrationResult{}, err
	}
	if degraded, reason, since := e.State(); degraded {
		return kvmanager.RegistrationResult{}, fmt.Errorf("%w: registry degraded since %s (%s): new registrations are refused until etcd is reachable again; rooms keep flowing on the cached view; retry",
			kvmanager.ErrRegistryUnavailable, since.UTC().Format(time.RFC3339), reason)
	}
	// The registration counts as a heartbeat here, from before it is in
	// etcd: should its lease end before the rooms here record it, this
	// daemon re-creates it instead of losing it.
	e.noteHeard(reg.Addr)
	rctx, cancel := e.requestCtx(ctx)
	err = e.publish(rctx, reg)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return kvmanager.RegistrationResult{}, ctx.Err()
		}
		e.obs.RegistryError("register")
		if errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			// etcd did not answer: the registry is degraded from now (the
			// probe clears it within a second if etcd is in fact fine).
			e.setState(true, "etcd unreachable: "+err.Error())
			return kvmanager.RegistrationResult{}, fmt.Errorf("%w: registry degraded: etcd did not record the registration within registry.etcd.request_timeout %s (%v): new registrations are refused until etcd is reachable again; rooms keep flowing on the cached view; retry",
				kvmanager.ErrRegistryUnavailable, e.cfg.RequestTimeout, err)
		}
		return kvmanager.RegistrationResult{}, fmt.Errorf("%w: the registration could not be recorded in etcd (%v); retry", kvmanager.ErrRegistryUnavailable, err)
	}
	e.noteRejected(reg.Addr, "", nil)
	return e.deps.Rooms.RecordPrefill(c)
}

// Heartbeat refreshes a rank here (kvmanager.Manager.Heartbeat) and notes
// that its instance heartbeats to this daemon: its lease is then kept alive
// from here.
func (e *Etcd) Heartbeat(ctx context.Context, rank kvmanager.RankID, instanceID string) (time.Duration, int, error) {
	iv, mf, err := e.deps.Rooms.Heartbeat(rank, instanceID)
	if err == nil {
		e.noteHeard(rank.Addr)
	} else if errors.Is(err, kvmanager.ErrPrefillNotFound) {
		e.mu.Lock()
		why := e.rejected[rank.Addr]
		e.mu.Unlock()
		if why != "" {
			return 0, 0, fmt.Errorf("%w: %s", kvmanager.ErrPrefillMismatch, why)
		}
	}
	return iv, mf, err
}

// publish writes one rank's registration: under the instance's lease when
// the instance is on record with the same instance id; else it creates the
// instance (a new lease), or replaces it when the instance id is new (the
// new records first, then the old lease is revoked, which removes the old
// ranks). Each write is conditional on the instance record it read, so
// concurrent registrations through several daemons agree on one lease.
func (e *Etcd) publish(ctx context.Context, reg kvmanager.Registration) error {
	instKey, rankKey := e.keys.instance(reg.Addr), e.keys.rank(rankID(reg))
	rr, err := encode(rankRecordOf(reg, e.cfg.AdvertiseAddress))
	if err != nil {
		return err
	}
	for range 4 {
		w, err := e.publishOnce(ctx, reg, instKey, rankKey, rr)
		if err == nil {
			// The view holds this daemon's writes at once, at the revision
			// etcd gave them (the watch confirms them later).
			e.mu.Lock()
			for _, kv := range w.kvs {
				e.put(&e.view, kv[0], []byte(kv[1]), w.rev)
			}
			e.view.rev = max(e.view.rev, w.rev)
			e.mu.Unlock()
			return nil
		}
		if !errors.Is(err, errStale) {
			return err
		}
	}
	return errors.New("the prefill instance's record kept changing under concurrent registrations")
}

// written is what one publication wrote: key/value pairs at revision rev.
type written struct {
	rev int64
	kvs [][2]string
}

// publishOnce is one attempt of publish; errStale asks for another.
func (e *Etcd) publishOnce(ctx context.Context, reg kvmanager.Registration, instKey, rankKey, rr string) (written, error) {
	{
		g, err := e.cli.Get(ctx, instKey)
		if err != nil {
			return written{}, err
		}
		var cur *instanceRecord
		var modRev int64
		if len(g.Kvs) == 1 {
			modRev = g.Kvs[0].ModRevision
			if rec, err := decode[instanceRecord](g.Kvs[0].Value); err == nil && rec.Lease != 0 && rec.Deregistered == "" {
				cur = &rec // a tombstone is no instance: a new one is created over it
			}
		}
		if cur != nil && (reg.InstanceID == "" || cur.InstanceID == "" || cur.InstanceID == reg.InstanceID) {
			return e.putRank(ctx, instKey, modRev, rankKey, rr, clientv3.LeaseID(cur.Lease))
		}
		return e.createInstance(ctx, reg, instKey, modRev, rankKey, rr, cur)
	}
}

// putRank puts a rank under the instance's lease, if the instance record
// is still the one read.
func (e *Etcd) putRank(ctx context.Context, instKey string, modRev int64, rankKey, rr string, lease clientv3.LeaseID) (written, error) {
	t, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(instKey), "=", modRev)).
		Then(clientv3.OpPut(rankKey, rr, clientv3.WithLease(lease))).Commit()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return written{}, errStale // the lease ended meanwhile: its records are gone, create them
	}
	if err != nil {
		return written{}, err
	}
	if !t.Succeeded {
		return written{}, errStale
	}
	return written{rev: t.Header.Revision, kvs: [][2]string{{rankKey, rr}}}, nil
}

// createInstance creates (modRev 0) or replaces (cur set) the instance's
// record under a new lease, with this rank.
func (e *Etcd) createInstance(ctx context.Context, reg kvmanager.Registration, instKey string, modRev int64, rankKey, rr string, cur *instanceRecord) (written, error) {
	g, err := e.cli.Grant(ctx, int64(e.cfg.LeaseTTL/time.Second))
	if err != nil {
		return written{}, err
	}
	rec, err := encode(instanceRecord{V: recordVersion, Addr: reg.Addr, InstanceID: reg.InstanceID, Lease: int64(g.ID),
		RegisteredVia: e.cfg.AdvertiseAddress, CreatedAt: e.now().UTC()})
	if err != nil {
		return written{}, err
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(instKey), "=", 0)
	if modRev != 0 {
		cmp = clientv3.Compare(clientv3.ModRevision(instKey), "=", modRev)
	}
	t, err := e.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(instKey, rec, clientv3.WithLease(g.ID)), clientv3.OpPut(rankKey, rr, clientv3.WithLease(g.ID))).Commit()
	if err != nil || !t.Succeeded {
		e.cli.Revoke(ctx, g.ID) //nolint:errcheck // best effort: an unused lease expires by itself
		if err != nil {
			return written{}, err
		}
		return written{}, errStale
	}
	if cur != nil {
		// The replaced instance's ranks are on its old lease: revoking it
		// removes them (the records just written are on the new one).
		if _, err := e.cli.Revoke(ctx, clientv3.LeaseID(cur.Lease)); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			e.log.Warn("fleet registry: could not revoke a replaced prefill instance's lease; its ranks leave the registry when it expires",
				"bootstrap_addr", reg.Addr, "old_instance_id", cur.InstanceID, "err", err, "lease_ttl", e.cfg.LeaseTTL)
		}
	}
	return written{rev: t.Header.Revision, kvs: [][2]string{{instKey, rec}, {rankKey, rr}}}, nil
}

// Touch counts as a heartbeat of the instance's every rank here
// (kvmanager.Manager.TouchPrefill: the HTTP bootstrap's health poll of an
// SGLang prefill) and, like Heartbeat, keeps its lease alive from here.
func (e *Etcd) Touch(_ context.Context, addr, instanceID string) bool {
	ok := e.deps.Rooms.TouchPrefill(addr, instanceID)
	if ok {
		e.noteHeard(addr)
	}
	return ok
}

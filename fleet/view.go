package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// view is the daemon's cached copy of the registry: what rooms are served
// from. It is changed by the snapshot, the watch, and this daemon's own
// registrations (at the revision etcd gave them, which the watch then
// confirms). Every instance and rank record holds the revision it is at: an
// older event for it (a lagging watch) changes nothing.
type view struct {
	rev       int64
	daemons   map[string]daemonRecord
	capacity  map[string]*pb.CapacityUpdate
	instances map[string]*instanceView
	// fingerprints are the daemons' published fingerprints (a daemon
	// whose record has none, or one out of bounds, is not in it).
	fingerprints map[string]*fingerprint
}

type instanceView struct {
	rec   instanceRecord
	ranks map[string]rankRecord // by key
}

func newView() view {
	return view{daemons: map[string]daemonRecord{}, capacity: map[string]*pb.CapacityUpdate{}, instances: map[string]*instanceView{},
		fingerprints: map[string]*fingerprint{}}
}

func (v *view) instance(addr string) *instanceView {
	iv := v.instances[addr]
	if iv == nil {
		iv = &instanceView{ranks: map[string]rankRecord{}}
		v.instances[addr] = iv
	}
	return iv
}

// change is one thing the rooms must hear of, applied after the view's
// lock is released.
type change struct {
	rank *rankRecord   // a registration to record (if not already)
	gone *instanceView // an instance whose records left the registry
	addr string        // gone's address
	// deregistered is why gone deregistered ("": its lease ended).
	deregistered string
}

// live reports whether the view holds a live record of the instance: under
// a lease, not a tombstone.
func (iv *instanceView) live() bool {
	return iv != nil && iv.rec.Lease != 0 && iv.rec.Deregistered == ""
}

// put applies one key's new value, written at revision rev, to the view
// and returns what the rooms must hear of. Values that do not decode are
// skipped with a warning.
func (e *Etcd) put(v *view, key string, value []byte, rev int64) *change {
	kind, addr := e.keys.parse(key)
	switch kind {
	case keyDaemon:
		rec, err := decode[daemonRecord](value)
		if err != nil {
			e.log.Warn("fleet registry: skipping a daemon record that does not decode", "key", key, "err", err)
			return nil
		}
		if addr == e.cfg.AdvertiseAddress && rec.incarnation() != e.deps.Self.Incarnation {
			e.log.Error("fleet registry: another daemon wrote this daemon's record: two daemons advertise the same address (registry.etcd.advertise_address)",
				"advertise_address", addr, "their_incarnation", rec.Incarnation, "our_incarnation", fmt.Sprintf("%016x", e.deps.Self.Incarnation))
		}
		v.daemons[addr] = rec
		f, err := parseFingerprint(rec.Fingerprint)
		if err != nil {
			e.log.Warn("fleet registry: ignoring a daemon's fingerprint out of its bounds (the daemon is taken to accept no prefill)", "key", key, "err", err)
		}
		if f != nil {
			v.fingerprints[addr] = f
		} else {
			delete(v.fingerprints, addr)
		}
	case keyCapacity:
		if len(value) > maxValueBytes {
			return nil
		}
		u := &pb.CapacityUpdate{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(value, u); err != nil {
			e.log.Warn("fleet registry: skipping a capacity record that does not decode", "key", key, "err", err)
			return nil
		}
		v.capacity[addr] = u
	case keyInstance:
		rec, err := decode[instanceRecord](value)
		if err != nil || rec.Addr != addr {
			e.log.Warn("fleet registry: skipping an instance record that does not decode", "key", key, "err", err)
			return nil
		}
		iv := v.instance(addr)
		if iv.rec.rev > rev {
			return nil // an older write than the view holds
		}
		rec.rev = rev
		if rec.Deregistered != "" {
			// A tombstone: the instance deregistered. Its rooms fail here
			// once (not again when its records leave with the lease).
			was := *iv
			iv.rec, iv.ranks = rec, map[string]rankRecord{}
			if was.live() && (was.rec.InstanceID == rec.InstanceID || rec.InstanceID == "") {
				return &change{gone: &was, addr: addr, deregistered: rec.Deregistered}
			}
			return nil
		}
		if iv.rec.InstanceID != rec.InstanceID {
			for k, r := range iv.ranks {
				if r.InstanceID != rec.InstanceID {
					delete(iv.ranks, k) // a replaced instance's ranks (its lease is being revoked)
				}
			}
		}
		iv.rec = rec
	case keyRank:
		rec, err := decode[rankRecord](value)
		if err != nil || rec.Addr != addr {
			e.log.Warn("fleet registry: skipping a rank record that does not decode", "key", key, "err", err)
			return nil
		}
		iv := v.instance(addr)
		if old, ok := iv.ranks[key]; ok && old.rev > rev {
			return nil
		}
		rec.rev = rev
		iv.ranks[key] = rec
		if !iv.live() || rec.InstanceID != iv.rec.InstanceID {
			return nil // not (or no longer) of the instance on record
		}
		return &change{rank: &rec}
	}
	return nil
}

// del applies one key's deletion at revision rev.
func (e *Etcd) del(v *view, key string, rev int64) *change {
	kind, addr := e.keys.parse(key)
	switch kind {
	case keyDaemon:
		delete(v.daemons, addr)
		delete(v.fingerprints, addr)
	case keyCapacity:
		delete(v.capacity, addr)
	case keyInstance:
		iv := v.instances[addr]
		if iv == nil || iv.rec.rev > rev {
			return nil // unknown, or re-written here after the deletion
		}
		delete(v.instances, addr)
		if iv.live() {
			return &change{gone: iv, addr: addr}
		}
	case keyRank:
		if iv := v.instances[addr]; iv != nil && iv.ranks[key].rev <= rev {
			delete(iv.ranks, key)
		}
	}
	return nil
}

// viewLoop builds the view from a snapshot, then follows the watch from
// the snapshot's revision; a failed watch or a reconnect rebuilds it from a
// fresh revision.
func (e *Etcd) viewLoop(ctx context.Context) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		rev, err := e.rebuild(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			e.obs.RegistryError("snapshot")
			e.unreachable(err)
			select {
			case <-ctx.Done():
				return
			case <-e.resync:
			case <-time.After(wait):
			}
			wait = min(2*wait, 2*time.Second)
			continue
		}
		select { // a rebuild asked while this one ran is this one
		case <-e.resync:
		default:
		}
		e.setState(false, "")
		wctx, cancel := context.WithCancel(ctx)
		started := time.Now()
		e.follow(ctx, e.cli.Watch(clientv3.WithRequireLeader(wctx), e.cfg.Prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1)))
		cancel()
		if time.Since(started) < time.Second {
			// A watch that fails at once (etcd refusing it) must not spin
			// snapshots: back off as for a failed snapshot.
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 2*time.Second)
		} else {
			wait = 100 * time.Millisecond
		}
	}
}

// follow applies the watch until it fails, ctx ends, or a rebuild is asked.
func (e *Etcd) follow(ctx context.Context, wch clientv3.WatchChan) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-e.resync:
			return
		case resp, ok := <-wch:
			if !ok {
				return
			}
			if err := resp.Err(); err != nil {
				if ctx.Err() == nil {
					e.obs.RegistryError("watch")
					e.log.Warn("fleet registry: the watch ended; rebuilding the view from a fresh revision", "err", err)
				}
				return
			}
			if resp.IsProgressNotify() {
				continue
			}
			var changes []*change
			e.mu.Lock()
			for _, ev := range resp.Events {
				var c *change
				if ev.Type == mvccpb.PUT {
					c = e.put(&e.view, string(ev.Kv.Key), ev.Kv.Value, ev.Kv.ModRevision)
				} else {
					c = e.del(&e.view, string(ev.Kv.Key), ev.Kv.ModRevision)
				}
				if c != nil {
					changes = append(changes, c)
				}
			}
			e.view.rev = max(e.view.rev, resp.Header.Revision)
			e.mu.Unlock()
			for _, c := range changes {
				e.applyChange(ctx, c, false)
			}
		}
	}
}

// rebuild reads the whole prefix at a fresh revision, replaces the view
// and tells the rooms what changed against the old one: instances gone
// (lost, or re-attached when they heartbeat here) and registrations new.
func (e *Etcd) rebuild(ctx context.Context) (int64, error) {
	rctx, cancel := e.requestCtx(ctx)
	resp, err := e.cli.Get(rctx, e.cfg.Prefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return 0, err
	}
	nv := newView()
	nv.rev = resp.Header.Revision
	for _, kv := range resp.Kvs {
		e.put(&nv, string(kv.Key), kv.Value, kv.ModRevision)
	}
	known := e.deps.Rooms.PrefillAddrs()
	e.mu.Lock()
	old, first := e.view, !e.synced
	e.view, e.synced = nv, true
	var changes []*change
	gone := map[string]bool{}
	for addr, oi := range old.instances {
		if ni := nv.instances[addr]; !ni.live() && oi.live() {
			c := &change{gone: oi, addr: addr}
			if ni != nil {
				c.deregistered = ni.rec.Deregistered
			}
			changes = append(changes, c)
			gone[addr] = true
		}
	}
	// Instances the rooms know that the registry no longer holds, though
	// the old view did not either (recorded here while their records were
	// being removed): lost too, with no records to re-create them from.
	for _, addr := range known {
		if ni := nv.instances[addr]; !ni.live() && !gone[addr] {
			c := &change{gone: &instanceView{}, addr: addr}
			if ni != nil {
				c.deregistered = ni.rec.Deregistered
			}
			changes = append(changes, c)
		}
	}
	for _, ni := range nv.instances {
		for _, r := range ni.ranks {
			if ni.live() && r.InstanceID == ni.rec.InstanceID {
				changes = append(changes, &change{rank: &r})
			}
		}
	}
	e.mu.Unlock()
	for _, c := range changes {
		e.applyChange(ctx, c, true)
	}
	if !first {
		e.obs.RegistryRebuilt()
		e.log.Info("fleet registry: view rebuilt from a fresh revision", "revision", nv.rev, "daemons", len(nv.daemons), "prefill_instances", len(nv.instances))
	}
	return nv.rev, nil
}

// applyChange tells the rooms of one change.
func (e *Etcd) applyChange(ctx context.Context, c *change, rebuilt bool) {
	if c.rank != nil {
		reg := c.rank.registration()
		if e.deps.Rooms.PrefillKnown(reg) {
			return
		}
		_, err := e.deps.Rooms.RegisterPrefill(reg)
		e.noteRejected(reg.Addr, c.rank.Via, err)
		if err != nil {
			e.obs.RegistryRejected()
			e.log.Warn("fleet registry: a prefill registration of the fleet is not accepted by this daemon (is its decode layout the fleet's?)",
				"bootstrap_addr", reg.Addr, "rank", rankID(reg).String(), "registered_via", c.rank.Via, "err", err)
		}
		return
	}
	if c.gone == nil {
		return
	}
	e.noteRejected(c.addr, "", nil)
	if c.deregistered != "" {
		// It stopped: never re-created, however recently it heartbeated.
		e.mu.Lock()
		delete(e.heard, c.addr)
		e.mu.Unlock()
		e.deps.Rooms.LosePrefill(c.addr, c.gone.rec.InstanceID, c.deregistered)
		return
	}
	if e.heardRecently(c.addr) && e.reattach(ctx, c.addr, c.gone) {
		return
	}
	var reason string
	if rebuilt {
		reason = fmt.Sprintf("it left the fleet registry while this daemon could not follow etcd (its lease expired: no rank heartbeated to any decode daemon of the fleet within registry.etcd.lease_ttl %s)", e.cfg.LeaseTTL)
	} else {
		reason = fmt.Sprintf("its fleet registry lease expired: no rank heartbeated to any decode daemon of the fleet within registry.etcd.lease_ttl %s", e.cfg.LeaseTTL)
	}
	e.deps.Rooms.LosePrefill(c.addr, c.gone.rec.InstanceID, reason)
}

// noteRejected records why this daemon refused the fleet's registration
// of the instance at addr, registered through via (err nil: it accepted
// it, or the instance left): a heartbeat or session hello of its ranks here
// is then refused with the reason (Heartbeat), not as unregistered.
func (e *Etcd) noteRejected(addr, via string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err == nil || !errors.Is(err, kvmanager.ErrPrefillMismatch) {
		delete(e.rejected, addr)
		return
	}
	e.rejected[addr] = fmt.Sprintf("the prefill instance registered in the fleet through %s is not accepted by this decode daemon: %s", via,
		strings.TrimPrefix(err.Error(), kvmanager.ErrPrefillMismatch.Error()+": "))
}

// heardRecently: the instance heartbeated here within three quarters of
// the lease TTL. A live instance heartbeats at least every half TTL
// (lease_ttl is at least two heartbeat intervals); one that only registered
// here, or stopped, was silent for a whole TTL when its lease expired.
func (e *Etcd) heardRecently(addr string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.heard[addr]
	return h != nil && e.now().Sub(h.at) < 3*e.cfg.LeaseTTL/4
}

// maxTxnOps stays below etcd's default --max-txn-ops (128).
const maxTxnOps = 100

// reattach re-creates the records of an instance whose lease ended while
// its ranks still heartbeat here (this daemon was cut off from etcd, or its
// keepalives did not arrive): a new lease, the same instance id and
// registrations, so that the rooms here go on. It reports false when it
// could not (the rooms then fail as lost); another daemon having
// re-created the instance first counts as done.
func (e *Etcd) reattach(ctx context.Context, addr string, iv *instanceView) bool {
	if len(iv.ranks) == 0 || iv.rec.Addr == "" {
		return false
	}
	rctx, cancel := e.requestCtx(ctx)
	defer cancel()
	g, err := e.cli.Grant(rctx, int64(e.cfg.LeaseTTL/time.Second))
	if err != nil {
		e.obs.RegistryError("register")
		return false
	}
	rec := iv.rec
	rec.Lease, rec.RegisteredVia, rec.CreatedAt = int64(g.ID), e.cfg.AdvertiseAddress, e.now().UTC()
	recStr, err := encode(rec)
	if err != nil {
		return false
	}
	ops := []clientv3.Op{clientv3.OpPut(e.keys.instance(addr), recStr, clientv3.WithLease(g.ID))}
	for k, r := range iv.ranks {
		if r.InstanceID != rec.InstanceID {
			continue
		}
		s, err := encode(r)
		if err != nil {
			continue
		}
		ops = append(ops, clientv3.OpPut(k, s, clientv3.WithLease(g.ID)))
	}
	first := ops[:min(len(ops), maxTxnOps)]
	t, err := e.cli.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(e.keys.instance(addr)), "=", 0)).Then(first...).Commit()
	if err != nil || !t.Succeeded {
		e.cli.Revoke(rctx, g.ID) //nolint:errcheck // best effort: an unused lease expires by itself
		if err != nil {
			e.obs.RegistryError("register")
			return false
		}
		return true // another daemon re-created it: the watch brings it back
	}
	for rest := ops[len(first):]; len(rest) > 0; rest = rest[min(len(rest), maxTxnOps):] {
		if _, err := e.cli.Txn(rctx).Then(rest[:min(len(rest), maxTxnOps)]...).Commit(); err != nil {
			e.obs.RegistryError("register")
		}
	}
	e.log.Warn("fleet registry: a prefill instance's lease ended while its ranks still heartbeat here; re-created its records under a new lease (its rooms on this daemon go on; other daemons that saw it leave failed theirs)",
		"bootstrap_addr", addr, "instance_id", rec.InstanceID, "lease", int64(g.ID))
	return true
}

// errStale: the instance record changed under a registration; it retries.
var errStale = errors.New("the instance record changed meanwhile")

// noteHeard records a heartbeat (or registration) of addr's instance here;
// an instance this daemon has not kept alive within a third of the lease
// TTL (it just failed over to this daemon) is kept alive at once.
func (e *Etcd) noteHeard(addr string) {
	now := e.now()
	e.mu.Lock()
	h := e.heard[addr]
	if h == nil {
		h = &heard{}
		e.heard[addr] = h
	}
	h.at = now
	kick := now.Sub(h.keptAlive) >= e.cfg.LeaseTTL/3
	e.mu.Unlock()
	if kick {
		select {
		case e.kick <- struct{}{}:
		default:
		}
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

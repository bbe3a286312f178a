package fleet

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/decodeplane/decodeplane/kvmanager"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Rooms is what the shared registry needs of the room manager
// (*kvmanager.Manager).
type Rooms interface {
	CheckPrefill(kvmanager.Registration) (kvmanager.CheckedRegistration, error)
	RecordPrefill(kvmanager.CheckedRegistration) (kvmanager.RegistrationResult, error)
	RegisterPrefill(kvmanager.Registration) (kvmanager.RegistrationResult, error)
	PrefillKnown(kvmanager.Registration) bool
	PrefillAddrs() []string
	LosePrefill(addr, instanceID, reason string) int
	Heartbeat(kvmanager.RankID, string) (time.Duration, int, error)
	TouchPrefill(addr, instanceID string) bool
	DeregisterPrefill(addr, instanceID, reason string) (removed bool, roomsFailed int)
}

// Observer counts what the registry does (the daemon's metrics); every
// method must be cheap and must not block.
type Observer interface {
	// RegistryDegraded reports the state: true while etcd is unreachable.
	RegistryDegraded(degraded bool)
	// RegistryError counts one failed etcd request by operation
	// ("register", "deregister", "keepalive", "publish_capacity",
	// "snapshot", "watch", "session").
	RegistryError(op string)
	// RegistryRebuilt counts one rebuild of the cached view from a fresh
	// revision.
	RegistryRebuilt()
	// RegistryRejected counts one registration of the view this daemon
	// does not accept (another layout).
	RegistryRejected()
}

type nopObserver struct{}

func (nopObserver) RegistryDegraded(bool) {}
func (nopObserver) RegistryError(string)  {}
func (nopObserver) RegistryRebuilt()      {}
func (nopObserver) RegistryRejected()     {}

// Self is this daemon's record.
type Self struct {
	Incarnation uint64
	Version     string
	StartedAt   time.Time
	Layout      *pb.KVLayout
	// Fingerprint is what a prefill must match for this daemon to accept
	// its hand-offs (published in its record; the registration check of
	// the other daemons reads it).
	Fingerprint *pb.Fingerprint
}

// CapacityFeed sends this daemon's capacity to send: the current figures at
// once, then on change at most once per minInterval and at least once per
// keepalive, until ctx ends (server.(*Server).FeedCapacity).
type CapacityFeed func(ctx context.Context, minInterval, keepalive time.Duration, send func(*pb.CapacityUpdate) error) error

// Deps are the registry's collaborators.
type Deps struct {
	Rooms  Rooms
	Self   Self
	Logger *slog.Logger
	// Observer defaults to counting nothing.
	Observer Observer
	// Capacity, when set, is published under capacity/<advertise_address>.
	Capacity CapacityFeed
	// Now defaults to time.Now.
	Now func() time.Time
	// OnState is called (from the registry's goroutines) when the state
	// changes: the daemon's readiness text.
	OnState func(degraded bool, reason string)
}

// Etcd is the registry shared by the daemons of a fleet through etcd. See
// the package comment for its keys, leases and failure semantics.
type Etcd struct {
	cfg  EtcdConfig
	keys keys
	deps Deps
	log  *slog.Logger
	obs  Observer
	cli  *clientv3.Client
	now  func() time.Time

	resync chan struct{} // a rebuild of the view is wanted (after a reconnect)
	kick   chan struct{} // an instance failed over to this daemon: keep its lease alive now

	// notifyMu orders the state's notifications (setState): held across
	// the state's read and the callbacks, so that they arrive in the order
	// the state changed.
	notifyMu sync.Mutex

	mu        sync.Mutex
	view      view
	reachable bool // the last probe (keepSession) succeeded
	degraded  bool
	reason    string
	since     time.Time
	synced    bool             // the view was built at least once
	ownLease  clientv3.LeaseID // 0 until granted
	heard     map[string]*heard
	// rejected: why this daemon refused the fleet's registration of an
	// instance (noteRejected), by bootstrap address.
	rejected map[string]string
	// startupWarned: the warning that etcd is unreachable since startup
	// was logged (under startupMu, which orders it before the state).
	startupWarned bool
	startupMu     sync.Mutex

	// afterKeepAlive, when set (tests only, before Run), runs between the
	// answer to this daemon's keepalive and its check against the view.
	afterKeepAlive func()
}

// heard is what this daemon knows of an instance's heartbeats to it.
type heard struct {
	at        time.Time // the last heartbeat (or registration) received here
	keptAlive time.Time // the last keepalive of its lease sent from here
}

// New builds the registry and its etcd client; it connects lazily (New
// does not wait for etcd), so a daemon starts degraded when etcd is down.
func New(cfg EtcdConfig, deps Deps) (*Etcd, error) {
	if deps.Rooms == nil {
		return nil, errors.New("fleet: Deps.Rooms is required")
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Observer == nil {
		deps.Observer = nopObserver{}
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	ccfg := clientv3.Config{
		Endpoints:            cfg.EndpointList(),
		DialTimeout:          cfg.DialTimeout,
		DialKeepAliveTime:    cfg.LeaseTTL / 3,
		DialKeepAliveTimeout: cfg.RequestTimeout,
		Username:             cfg.Username,
		Password:             cfg.Password,
		Logger:               zap.NewNop(),
		PermitWithoutStream:  true,
	}
	if cfg.PasswordFile != "" {
		b, err := os.ReadFile(cfg.PasswordFile)
		if err != nil {
			return nil, fmt.Errorf("registry.etcd.password_file: %w", err)
		}
		ccfg.Password = strings.TrimRight(string(b), "\r\n")
	}
	if cfg.TLS.Enabled() || strings.HasPrefix(strings.TrimSpace(cfg.Endpoints), "https://") {
		tc, err := clientTLS(cfg.TLS)
		if err != nil {
			return nil, err
		}
		ccfg.TLS = tc
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("registry.etcd: %w", err)
	}
	e := &Etcd{cfg: cfg, keys: keys{prefix: cfg.Prefix}, deps: deps, log: deps.Logger, obs: deps.Observer, cli: cli, now: deps.Now,
		resync: make(chan struct{}, 1), kick: make(chan struct{}, 1), heard: map[string]*heard{}, rejected: map[string]string{}, view: newView()}
	e.degraded, e.reason, e.since = true, "connecting to etcd", e.now()
	e.obs.RegistryDegraded(true) // until the first view is built
	return e, nil
}

func clientTLS(t TLS) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("registry.etcd.tls.ca_file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("registry.etcd.tls.ca_file %s: no PEM certificate in it", t.CAFile)
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("registry.etcd.tls.cert_file/key_file: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// Close closes the etcd client (after Run returned).
func (e *Etcd) Close() error { return e.cli.Close() }

// Run keeps the daemon's record, the view and the leases until ctx ends;
// then it revokes the daemon's own lease (its record and capacity leave
// the registry at once) and returns nil.
func (e *Etcd) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { e.viewLoop(gctx); return nil })
	g.Go(func() error { e.sessionLoop(gctx); return nil })
	if e.deps.Capacity != nil && e.cfg.CapacityInterval > 0 {
		g.Go(func() error { e.capacityLoop(gctx); return nil })
	}
	err := g.Wait()
	e.mu.Lock()
	lease := e.ownLease
	e.ownLease = 0
	e.mu.Unlock()
	if lease != 0 {
		rctx, cancel := context.WithTimeout(context.Background(), e.cfg.RequestTimeout)
		if _, rerr := e.cli.Revoke(rctx, lease); rerr != nil {
			e.log.Warn("fleet registry: could not revoke this daemon's lease on shutdown (its record expires with the lease)", "err", rerr, "lease_ttl", e.cfg.LeaseTTL)
		}
		cancel()
	}
	return err
}

// tick is the session loop's period: the probe of etcd and the daemon's own
// keepalive. Instance keepalives and the record refresh run every third of
// the lease TTL.
func (e *Etcd) tick() time.Duration { return min(time.Second, e.cfg.LeaseTTL/3) }

// setState records the registry's state and reports a change (of the
// state, or of the reason while degraded), in order.
func (e *Etcd) setState(degraded bool, reason string) {
	e.notifyMu.Lock()
	defer e.notifyMu.Unlock()
	e.mu.Lock()
	changed := e.degraded != degraded
	reasonChanged := degraded && e.reason != reason
	if changed {
		e.since = e.now()
	}
	e.degraded, e.reason = degraded, reason
	e.mu.Unlock()
	if !changed && !reasonChanged {
		return
	}
	if changed {
		e.obs.RegistryDegraded(degraded)
		if degraded {
			e.log.Warn("fleet registry degraded: rooms keep flowing on the cached view; new registrations are refused until etcd is reachable", "reason", reason, "endpoints", e.cfg.Endpoints)
		} else {
			e.log.Info("fleet registry reachable again", "endpoints", e.cfg.Endpoints)
		}
	}
	if e.deps.OnState != nil {
		e.deps.OnState(degraded, reason)
	}
}

// startupFix is what to check when etcd has not answered since startup.
const startupFix = "check that etcd runs and that this host reaches it at registry.etcd.endpoints (address, port, firewall; " +
	"an https:// endpoint needs registry.etcd.tls; an etcd with authentication needs registry.etcd.username and a password); " +
	"the daemon connects by itself once etcd answers"

// unreachable records that etcd did not answer a request of the session
// or view loop: the registry is degraded. Until the first view was built
// (etcd unreachable since startup) the reason says so, and the first such
// failure is logged as a warning with the fix.
func (e *Etcd) unreachable(err error) {
	// Both loops fail at startup: the warning is logged before either
	// reports the state, once.
	e.startupMu.Lock()
	defer e.startupMu.Unlock()
	e.mu.Lock()
	synced, warned := e.synced, e.startupWarned
	if !synced {
		e.startupWarned = true
	}
	e.mu.Unlock()
	if synced {
		e.setState(true, "etcd unreachable: "+err.Error())
		return
	}
	if !warned {
		e.log.Warn("fleet registry: etcd is unreachable since startup: rooms are served on an empty view (no prefill instance of the fleet is known) and prefill registrations are refused until etcd answers",
			"endpoints", e.cfg.Endpoints, "err", err, "fix", startupFix)
	}
	e.setState(true, fmt.Sprintf("etcd unreachable since startup at registry.etcd.endpoints %s (%v): %s", e.cfg.Endpoints, err, startupFix))
}

// wantResync asks the view loop for a rebuild from a fresh revision.
func (e *Etcd) wantResync() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
}

// State is the registry's state: degraded while etcd is unreachable (or
// before the first view was built), with the reason and since when.
func (e *Etcd) State() (degraded bool, reason string, since time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.degraded, e.reason, e.since
}

func (e *Etcd) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, e.cfg.RequestTimeout)
}

// sessionLoop keeps this daemon's lease and record, probes etcd, and keeps
// alive the leases of the instances that heartbeat here.
func (e *Etcd) sessionLoop(ctx context.Context) {
	t := time.NewTicker(e.tick())
	defer t.Stop()
	var lastRecord, lastInstances time.Time
	for {
		err := e.keepSession(ctx, &lastRecord)
		e.mu.Lock()
		e.reachable = err == nil
		wasDegraded, synced := e.degraded, e.synced
		e.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			e.obs.RegistryError("session")
			e.unreachable(err)
		} else {
			if wasDegraded && synced {
				// Reachable again: the view is rebuilt from a fresh revision
				// before the registry says it is ok (viewLoop clears it).
				e.wantResync()
			}
			if now := e.now(); now.Sub(lastInstances) >= e.cfg.LeaseTTL/3 && e.keepInstances(ctx) {
				lastInstances = now
			}
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				waiting = false
			case <-e.kick:
				e.keepInstances(ctx)
			}
		}
	}
}

// keepSession grants the daemon's lease if it has none (or lost it), puts
// its record, and keeps the lease alive: one request per tick, which is
// also the probe of etcd.
func (e *Etcd) keepSession(ctx context.Context, lastRecord *time.Time) error {
	e.mu.Lock()
	// viewRev is read before the request: the watch loop and this daemon's
	// own publications advance the view while the keepalive is in flight,
	// past the revision etcd answers it at, which is no sign of anything.
	lease, viewRev := e.ownLease, e.view.rev
	e.mu.Unlock()
	rctx, cancel := e.requestCtx(ctx)
	defer cancel()
	if lease != 0 {
		ka, err := e.cli.KeepAliveOnce(rctx, lease)
		if h := e.afterKeepAlive; h != nil {
			h()
		}
		if err == nil {
			if ka.ResponseHeader != nil && ka.Revision < viewRev {
				// etcd answers at a revision below one the view had reached
				// before the request was sent: etcd lost its data (restored
				// or re-created); the view's watch would wait for a revision
				// that may never come.
				e.log.Warn("fleet registry: etcd's revision is behind the view's; rebuilding the view", "etcd_revision", ka.Revision, "view_revision", viewRev)
				e.wantResync()
			}
			if e.now().Sub(*lastRecord) < e.cfg.LeaseTTL/3 {
				return nil
			}
		} else if !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return err
		} else {
			e.log.Warn("fleet registry: this daemon's lease is gone (etcd could not be reached for longer than registry.etcd.lease_ttl, or lost its data); re-registering the daemon and rebuilding the view", "lease_ttl", e.cfg.LeaseTTL)
			lease = 0
			e.wantResync()
		}
	}
	if lease == 0 {
		g, err := e.cli.Grant(rctx, int64(e.cfg.LeaseTTL/time.Second))
		if err != nil {
			return err
		}
		lease = g.ID
		e.mu.Lock()
		e.ownLease = lease
		e.mu.Unlock()
	}
	rec, err := e.selfRecord(lease)
	if err != nil {
		return err
	}
	if _, err := e.cli.Put(rctx, e.keys.daemon(e.cfg.AdvertiseAddress), rec, clientv3.WithLease(lease)); err != nil {
		return err
	}
	*lastRecord = e.now()
	return nil
}

func (e *Etcd) selfRecord(lease clientv3.LeaseID) (string, error) {
	s := e.deps.Self
	rec := daemonRecord{V: recordVersion, Address: e.cfg.AdvertiseAddress, Incarnation: fmt.Sprintf("%016x", s.Incarnation),
		Version: s.Version, StartedAt: s.StartedAt.UTC(), Lease: int64(lease)}
	if s.Layout != nil {
		b, err := protojson.Marshal(s.Layout)
		if err != nil {
			return "", err
		}
		rec.Layout = b
	}
	if s.Fingerprint != nil {
		b, err := protojson.Marshal(s.Fingerprint)
		if err != nil {
			return "", err
		}
		rec.Fingerprint = b
	}
	return encode(rec)
}

// keepInstances keeps alive, once per third of the lease TTL, the lease of
// every instance that heartbeated here since its last keepalive from here.
// It reports false when it sent nothing because etcd did not answer the
// last probe.
func (e *Etcd) keepInstances(ctx context.Context) bool {
	type due struct {
		addr  string
		lease clientv3.LeaseID
	}
	var todo []due
	now := e.now()
	e.mu.Lock()
	if !e.reachable {
		// etcd did not answer the probe: every keepalive would wait for its
		// timeout and hold up the probe that sees etcd back. They resume
		// then. (The view may still be rebuilding — degraded — but etcd
		// answers: the leases of live instances must not lapse meanwhile.)
		e.mu.Unlock()
		return false
	}
	for addr, h := range e.heard {
		if now.Sub(h.at) > e.cfg.LeaseTTL {
			delete(e.heard, addr) // silent here for a whole TTL: no longer ours to keep
			continue
		}
		if !h.at.After(h.keptAlive) {
			continue
		}
		inst := e.view.instances[addr]
		if !inst.live() {
			continue
		}
		todo = append(todo, due{addr, clientv3.LeaseID(inst.rec.Lease)})
		h.keptAlive = now
	}
	e.mu.Unlock()
	// At most keepaliveConcurrency at a time, each bounded by the request
	// timeout: a slow etcd holds the session loop up for a few timeouts,
	// not one per instance.
	// The first failure that is not a missing lease stops the batch: etcd
	// is not answering, and the probe will say so.
	bctx, stop := context.WithCancel(ctx)
	defer stop()
	var g errgroup.Group
	g.SetLimit(keepaliveConcurrency)
	for _, d := range todo {
		g.Go(func() error {
			if bctx.Err() != nil {
				return nil
			}
			rctx, cancel := e.requestCtx(bctx)
			_, err := e.cli.KeepAliveOnce(rctx, d.lease)
			cancel()
			if err != nil && bctx.Err() == nil {
				e.obs.RegistryError("keepalive")
				if errors.Is(err, rpctypes.ErrLeaseNotFound) {
					e.log.Warn("fleet registry: a prefill instance's lease is gone although it heartbeats here; its records are re-created when their deletion arrives", "bootstrap_addr", d.addr)
				} else {
					stop()
				}
			}
			return nil
		})
	}
	g.Wait() //nolint:errcheck // the goroutines return nil
	return true
}

// keepaliveConcurrency bounds the instance keepalives in flight.
const keepaliveConcurrency = 16

// capacityLoop publishes this daemon's capacity on its own lease.
func (e *Etcd) capacityLoop(ctx context.Context) {
	key := e.keys.capacity(e.cfg.AdvertiseAddress)
	var seq uint64
	for ctx.Err() == nil {
		err := e.deps.Capacity(ctx, e.cfg.CapacityInterval, e.cfg.LeaseTTL/3, func(u *pb.CapacityUpdate) error {
			e.mu.Lock()
			lease, degraded := e.ownLease, e.degraded
			e.mu.Unlock()
			if lease == 0 || degraded {
				return nil // published again at the next change or keepalive
			}
			seq++
			u.Sequence = seq
			u.Address = e.cfg.AdvertiseAddress
			u.Fingerprint = nil // in the daemon's record, written once, not at every publication
			b, err := protojson.Marshal(u)
			if err != nil {
				return err
			}
			rctx, cancel := e.requestCtx(ctx)
			defer cancel()
			if _, err := e.cli.Put(rctx, key, string(b), clientv3.WithLease(lease)); err != nil && ctx.Err() == nil {
				e.obs.RegistryError("publish_capacity")
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			e.log.Warn("fleet registry: capacity publication stopped; restarting it", "err", err)
		}
		select { // the feed ended (the server stopped, or an error): never spin
		case <-ctx.Done():
		case <-time.After(e.cfg.CapacityInterval):
		}
	}
}

// Command decodeplane-agent is the reference transfer agent: it implements
// decodeplane.transfer.v1.TransferAgent with every buffer in host memory and
// moves real bytes, so that decodeplane's delegated transfer path can be
// tried, and verified byte for byte, without GPUs.
//
//	decodeplane-agent [--listen 127.0.0.1:7700] [--max-memory-mb 4096] [--log-level info]
//	                  [--shared-memory-dirs /dev/shm]
//	                  [--tls-cert FILE --tls-key FILE [--tls-client-ca FILE]]
//
// A buffer's memory is either allocated by the agent (within
// --max-memory-mb) or, on Linux, a region of a shared-memory file an engine
// created (BufferMemory.shared), mapped shared so that the engine sees every
// byte the agent writes; such files must lie under --shared-memory-dirs
// (any client that reaches the agent can have it read and write them) and
// must not be truncated while registered. GPU memory (CUDA IPC, NIXL) needs
// a GPU transfer agent: it is refused. On shutdown every mapping is
// released; the files stay the engine's.
//
// With --tls-cert/--tls-key it serves TLS; with --tls-client-ca too, mutual
// TLS (the daemon's transfer.delegate.tls.cert_file must be signed by that
// CA; --tls-require-client-cert=false admits clients without one). The files
// are re-read every --tls-reload-interval and changed, valid ones serve the
// connections made from then on.
//
// Point the daemon at it with `decodeplane serve --transfer-path delegate
// --agent 127.0.0.1:7700`. It serves gRPC health (SERVING while it runs) and
// reflection, and stops gracefully on SIGINT/SIGTERM: batches in flight are
// cancelled. Exit codes: 0 success, 1 runtime failure, 2 usage.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/validator"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/decodeplane/decodeplane/internal/buildinfo"
	"github.com/decodeplane/decodeplane/internal/stormlog"
	"github.com/decodeplane/decodeplane/internal/tlsreload"
	"github.com/decodeplane/decodeplane/server/grpcdecode"
	"github.com/decodeplane/decodeplane/transfer/agentservice"
	"github.com/decodeplane/decodeplane/transfer/hostmem"
	"github.com/decodeplane/decodeplane/transfer/kvcopy"
)

// version and commit are set at build time with -ldflags "-X
// main.version=... -X main.commit=..." (make build: the git tag and commit);
// init completes them from Go's VCS stamp (internal/buildinfo).
var version, commit = "dev", ""

func init() { version, commit = buildinfo.Resolve(version, commit) }

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

type options struct {
	listen          string
	maxMemoryMB     int64
	logLevel        string
	reflection      bool
	shutdownTimeout time.Duration
	holdRooms       []uint64
	holdPastCancel  bool
	failRooms       []uint64
	sharedDirs      []string
	tls             tlsOptions
}

// tlsOptions are the listener's TLS flags.
type tlsOptions struct {
	cert, key, clientCA string
	requireClientCert   bool
	reloadInterval      time.Duration
}

// roomList is a comma-separated list of rooms (testing faults).
type roomList struct{ rooms *[]uint64 }

func (r roomList) String() string { return "" }
func (r roomList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			return fmt.Errorf("%q is not a room id", f)
		}
		*r.rooms = append(*r.rooms, n)
	}
	return nil
}

func parse(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("decodeplane-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:7700", "gRPC listen address")
	fs.Int64Var(&o.maxMemoryMB, "max-memory-mb", 4096, "most host memory the agent allocates for registered buffers, in MiB (0: no limit); shared memory an engine registers is the engine's and is not counted")
	sharedDirs := fs.String("shared-memory-dirs", "/dev/shm", "comma-separated absolute directories whose files engines may register as shared memory (symlinks resolved; empty: none)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.BoolVar(&o.reflection, "reflection", true, "register gRPC server reflection")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 10*time.Second, "bound on the graceful stop")
	fs.Var(roomList{&o.holdRooms}, "fault-hold-rooms", "testing: accept the batches of these rooms (comma-separated) but never run them until cancelled or past their deadline")
	fs.BoolVar(&o.holdPastCancel, "fault-hold-past-cancel", false, "testing: the batches --fault-hold-rooms holds ignore CancelRoom and end only at their deadline (an agent whose copies cannot be recalled); CancelRoom waits for them")
	fs.Var(roomList{&o.failRooms}, "fault-fail-rooms", "testing: fail every batch of these rooms (comma-separated) with an injected error")
	fs.StringVar(&o.tls.cert, "tls-cert", "", "serve TLS with this PEM certificate (chain)")
	fs.StringVar(&o.tls.key, "tls-key", "", "the PEM private key of --tls-cert")
	fs.StringVar(&o.tls.clientCA, "tls-client-ca", "", "mutual TLS: verify client certificates against this PEM CA bundle")
	fs.BoolVar(&o.tls.requireClientCert, "tls-require-client-cert", true, "with --tls-client-ca: refuse clients without a certificate (false: verify only those given)")
	fs.DurationVar(&o.tls.reloadInterval, "tls-reload-interval", tlsreload.DefaultInterval, "how often the TLS files are re-read for changes")
	err := fs.Parse(args)
	if err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		return o, fmt.Errorf("--listen %q is not host:port", o.listen)
	}
	if o.sharedDirs, err = parseDirs(*sharedDirs); err != nil {
		return o, err
	}
	if o.maxMemoryMB < 0 {
		return o, fmt.Errorf("--max-memory-mb must not be negative (got %d)", o.maxMemoryMB)
	}
	if o.shutdownTimeout <= 0 {
		return o, fmt.Errorf("--shutdown-timeout must be > 0 (got %s)", o.shutdownTimeout)
	}
	if err := o.tls.check(); err != nil {
		return o, err
	}
	return o, nil
}

// parseDirs splits --shared-memory-dirs; each directory is absolute.
func parseDirs(v string) ([]string, error) {
	var dirs []string
	for _, d := range strings.Split(v, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("--shared-memory-dirs: %q is not an absolute directory", d)
		}
		dirs = append(dirs, filepath.Clean(d))
	}
	return dirs, nil
}

// check validates the TLS flags and files, every problem at once.
func (t tlsOptions) check() error {
	var errs []error
	switch {
	case (t.cert == "") != (t.key == ""):
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	case t.cert == "" && t.clientCA != "":
		errs = append(errs, errors.New("--tls-client-ca (mutual TLS) needs the agent's own --tls-cert and --tls-key"))
	}
	if t.reloadInterval <= 0 {
		errs = append(errs, fmt.Errorf("--tls-reload-interval must be > 0 (got %s)", t.reloadInterval))
	}
	flagOf := map[string]string{"cert": "--tls-cert", "key": "--tls-key", "ca": "--tls-client-ca"}
	for _, p := range tlsreload.Check(tlsreload.Files{Cert: t.cert, Key: t.key, CA: t.clientCA}, time.Now()) {
		errs = append(errs, fmt.Errorf("%s %s: %s", flagOf[p.File], p.Path, p.Message))
	}
	return errors.Join(errs...)
}

func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "version" || args[0] == "--version") {
		fmt.Fprintln(stderr, buildinfo.Line("decodeplane-agent", version, commit))
		return exitOK
	}
	o, err := parse(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintf(stderr, "decodeplane-agent: %v\n", err)
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(stderr, "decodeplane-agent: --log-level %q: %v\n", o.logLevel, err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	storm := stormlog.New(log, stormlog.Options{}) // lines about many batches at once: one per interval
	defer storm.Close()
	agent := newAgent(o, log, storm)
	defer func() { // after the batches and the server stopped: unmap the shared memory
		if err := agent.Store().Close(); err != nil {
			log.Error("releasing the buffers", "err", err)
		}
	}()
	svc := agentservice.New(agent, log)
	serverOpts, stopTLS, err := serverOptions(o, log, storm)
	if err != nil {
		log.Error("TLS files", "err", err)
		return exitUsage
	}
	defer stopTLS()
	gs := grpc.NewServer(serverOpts...)
	svc.Register(gs)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	if o.reflection {
		reflection.Register(gs)
	}
	lis, err := net.Listen("tcp", o.listen)
	if err != nil {
		log.Error("listen failed", "listen", o.listen, "err", err)
		return exitFailure
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus("decodeplane.transfer.v1.TransferAgent", healthpb.HealthCheckResponse_SERVING)
	serveErr := make(chan error, 1)
	go func() { serveErr <- gs.Serve(lis) }()
	log.Info("decodeplane-agent serving", "listen", lis.Addr().String(), "version", version, "instance", svc.Instance(), "max_memory_mb", o.maxMemoryMB,
		"shared_memory_dirs", strings.Join(o.sharedDirs, ","), "tls", o.tls.mode())

	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	case err := <-serveErr:
		log.Error("serve failed", "err", err)
		svc.Close()
		return exitFailure
	}
	hs.Shutdown()
	svc.Close() // cancel batches in flight; ends the completion streams
	stopServer(gs, o.shutdownTimeout, log)
	log.Info("decodeplane-agent stopped")
	return exitOK
}

// newAgent is the reference agent over host memory, with the faults the
// flags inject.
func newAgent(o options, log *slog.Logger, storm *stormlog.Logger) *hostmem.Agent {
	agent := hostmem.NewAgent(hostmem.NewStore(hostmem.Options{Limit: o.maxMemoryMB << 20, SharedDirs: o.sharedDirs}))
	if len(o.holdRooms) > 0 {
		log.Warn("fault injection: holding the batches of rooms", "rooms", o.holdRooms)
		agent.SetHold(holdFunc(o, log, storm))
		agent.SetHoldPastCancel(o.holdPastCancel)
	}
	if len(o.failRooms) > 0 {
		log.Warn("fault injection: failing the batches of rooms", "rooms", o.failRooms)
		agent.SetFault(func(b kvcopy.Batch) error {
			if slices.Contains(o.failRooms, b.Room) {
				return fmt.Errorf("injected fault (--fault-fail-rooms): batch %s of room %d refused before copy 0", b.ID, b.Room)
			}
			return nil
		})
	}
	return agent
}

// holdFunc says whether a batch is one --fault-hold-rooms holds; each held
// batch is logged at Debug with its room, and counted at Info through
// storm (a line per interval, however many rooms are held).
func holdFunc(o options, log *slog.Logger, storm *stormlog.Logger) func(kvcopy.Batch) bool {
	held := make(map[uint64]bool, len(o.holdRooms))
	for _, r := range o.holdRooms {
		held[r] = true
	}
	return func(b kvcopy.Batch) bool {
		if !held[b.Room] {
			return false
		}
		log.Debug("batch held (--fault-hold-rooms)", "batch", b.ID, "room", b.Room, "past_cancel", o.holdPastCancel)
		storm.Log(context.Background(), slog.LevelInfo, "batch held (--fault-hold-rooms)", nil, strconv.FormatUint(b.Room, 10),
			slog.String("batch", b.ID), slog.Uint64("room", b.Room), slog.Bool("past_cancel", o.holdPastCancel))
		return true
	}
}

// serverOptions are the gRPC server's options: the decoding codec, the
// message bounds, TLS (its reloader runs until stop), recovery and
// validation (a panic is logged through storm: a line per interval).
func serverOptions(o options, log *slog.Logger, storm *stormlog.Logger) (opts []grpc.ServerOption, stop func(), err error) {
	stop = func() {}
	recoveryOpt := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		storm.Log(ctx, slog.LevelError, "panic in gRPC handler", nil, "", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		return status.Error(codes.Internal, "internal error (logged by the agent)")
	})
	serverOpts := append(grpcdecode.DecodeOptions(), // first: undecodable requests are InvalidArgument
		grpc.MaxRecvMsgSize(64<<20), grpc.MaxSendMsgSize(64<<20))
	if o.tls.cert != "" {
		reloader, err := tlsreload.New(tlsreload.Options{Name: "agent", Interval: o.tls.reloadInterval, Logger: log,
			Files: tlsreload.Files{Cert: o.tls.cert, Key: o.tls.key, CA: o.tls.clientCA}})
		if err != nil {
			return nil, stop, err
		}
		serverOpts = append(serverOpts, grpc.Creds(reloader.ServerCredentials(o.tls.requireClientCert)))
		rctx, cancel := context.WithCancel(context.Background())
		reloadDone := make(chan struct{})
		go func() {
			defer close(reloadDone)
			_ = reloader.Run(rctx)
		}()
		stop = func() {
			cancel()
			<-reloadDone
		}
	}
	return append(serverOpts,
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(recoveryOpt), validator.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recoveryOpt), validator.StreamServerInterceptor()),
	), stop, nil
}

// mode says how the agent's server is secured, for its start line.
func (t tlsOptions) mode() string {
	switch {
	case t.cert != "" && t.clientCA != "":
		return fmt.Sprintf("mutual TLS (client certificate required: %v)", t.requireClientCert)
	case t.cert != "":
		return "TLS"
	}
	return "off (plaintext)"
}

// stopServer stops gs gracefully, forcibly after timeout.
func stopServer(gs *grpc.Server, timeout time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		log.Warn("graceful stop did not finish in time; stopping")
		gs.Stop()
		<-done
	}
}

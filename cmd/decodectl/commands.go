package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/decodeplane/decodeplane/client"
	"github.com/decodeplane/decodeplane/internal/buildinfo"
	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// timeNow is the clock used for ages (a variable for tests).
var timeNow = time.Now

// command is one decodectl command.
type command struct {
	name string
	// synopsis is the usage line after "decodectl NAME".
	synopsis string
	// summary is the one-line description in the command list.
	summary string
	// help is the command's own help text (its flags and behaviour).
	help string
	// flags declares the command's own flags.
	flags func(fs *flag.FlagSet, o *options)
	// daemon is set when the command needs a connection.
	daemon bool
	run    func(ctx context.Context, x *cli, args []string) error
}

// commands lists every command, in help order.
var commands []*command

func init() {
	commands = []*command{
		{
			name: "status", synopsis: "[--config]", daemon: true,
			summary: "version, readiness, uptime, KV layout, rooms by phase, shards, prefills",
			help: `  --config        also print the effective configuration and where each value came from
  -o json         the Admin.GetStatus answer`,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.config, "config", false, "")
			},
			run: cmdStatus,
		},
		fleetCommand,
		{
			name: "rooms", synopsis: "[--phase P,...] [--prefill ADDR] [--live] [--oldest] [--limit N] [-w [--interval D]]", daemon: true,
			summary: "list live and recently finished rooms",
			help: `  --phase P,...   only rooms in these phases (` + joinPhases() + `)
  --prefill ADDR  only rooms of this prefill instance (its bootstrap address)
  --live          only rooms that have not ended
  --limit N       show at most N rooms, newest first (default 100; 0: the daemon's maximum)
  --oldest        oldest first instead (the limit then keeps the oldest rooms)
  -w, --watch     refresh every --interval until interrupted; on a terminal each refresh redraws
                  the table to fit the screen (newest rooms first, "… N more rooms" below),
                  otherwise (a pipe, | tee) the table is printed once and then one line per
                  room that appears, changes or leaves the list (nothing when idle)
  --interval D    refresh period for --watch (default 1s; a terminal: at most 4 redraws a second)
  -o json         the Rooms.ListRooms answer (with --watch: one document per line per refresh)`,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.phases, "phase", "", "")
				fs.StringVar(&o.prefill, "prefill", "", "")
				fs.BoolVar(&o.live, "live", false, "")
				fs.BoolVar(&o.oldest, "oldest", false, "")
				fs.UintVar(&o.limit, "limit", defaultLimit, "")
				fs.BoolVar(&o.watch, "w", false, "")
				fs.BoolVar(&o.watch, "watch", false, "")
				fs.DurationVar(&o.interval, "interval", defaultInterval, "")
			},
			run: cmdRooms,
		},
		{
			name: "room", synopsis: "ID | --latest | --latest-failed [--pages]", daemon: true,
			summary: "a room's details and its timeline of transitions",
			help: `  ID              the bootstrap room (decodectl rooms lists them, newest first)
  --latest        instead of an ID: the room opened last (of those the daemon still holds)
  --latest-failed instead of an ID: the failed room opened last
  --pages         also print the room's KV page indices (runs of consecutive pages as a-b)
  -o json         the Rooms.GetRoom answer (a Room; page_indices with --pages)

The timeline's SGLANG column names the transitions of SGLang's decode side
(T1..T23) that each step corresponds to; docs/sglang-transitions.md in the
decodeplane repository says what each one is.`,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.BoolVar(&o.pages, "pages", false, "")
				fs.BoolVar(&o.latest, "latest", false, "")
				fs.BoolVar(&o.latestFailed, "latest-failed", false, "")
			},
			run: cmdRoom,
		},
		{
			name: "abort", synopsis: "ID [--reason TEXT]", daemon: true,
			summary: "fail a room in any phase and return its resources (needs the token)",
			help: `  --reason TEXT   the failure message (default SGLang's "Aborted by AbortReq.")
  -o json         the Rooms.AbortRoom answer`,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.reason, "reason", "", "")
			},
			run: cmdAbort,
		},
		{
			name: "drain", daemon: true,
			summary: "stop admitting rooms (health NOT_SERVING); list the rooms still in flight (needs the token)",
			help:    `  -o json         the Admin.Drain answer`,
			run:     cmdDrain,
		},
		{
			name: "lookup", synopsis: "--prefill ADDR [--hint ROOM=DP]... ROOM...", daemon: true,
			summary: "resolve rooms to prefill DP ranks, and say by which rule",
			help: `  --prefill ADDR  the prefill instance (its bootstrap address); required
  --hint ROOM=DP  a router hint for ROOM (disagg_prefill_dp_rank); repeatable
  -o json         the Bootstrap.LookupDPRanks answer`,
			flags: func(fs *flag.FlagSet, o *options) {
				fs.StringVar(&o.prefill, "prefill", "", "")
				fs.Var(&o.hints, "hint", "")
			},
			run: cmdLookup,
		},
		{
			name: "version", summary: "print decodectl's version (status prints the daemon's)",
			help: `  -o json         {"version": "..."}`,
			run:  cmdVersion,
		},
	}
}

// lookupCommand returns the command called name, or nil.
func lookupCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// cli is one command's environment.
type cli struct {
	opts           *options
	cmd            *command
	c              *client.Client
	stdout, stderr io.Writer
	now            func() time.Time
}

// callCtx bounds one RPC by --timeout.
func (x *cli) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, x.opts.timeout)
}

// jsonOptions render answers for scripts: proto field names, so that the
// keys are stable (they are the API's field names).
// jsonOptions emit every field, zero values included, so that scripts can
// rely on a field's presence (e.g. "ready": false while draining).
var jsonOptions = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true, Indent: "  "}

// writeJSON prints m as one JSON document.
func writeJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOptions.Marshal(m)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// noArgs refuses positional arguments.
func noArgs(args []string) error {
	if len(args) > 0 {
		return usagef("unexpected argument %q", args[0])
	}
	return nil
}

// oneRoom parses the single room ID argument.
func oneRoom(args []string) (uint64, error) {
	switch len(args) {
	case 0:
		return 0, usagef("missing room ID (decodectl rooms lists them; decodectl room --latest shows the newest)")
	case 1:
		return parseRoomID(args[0])
	}
	return 0, usagef("one room ID expected, got %d arguments", len(args))
}

// cmdStatus prints Admin.GetStatus and the standard health status.
func cmdStatus(ctx context.Context, x *cli, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	st, err := x.c.Admin().Status(cctx)
	if err != nil {
		return &callError{what: "status", err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, st)
	}
	return writeStatus(x.stdout, st, x.health(cctx), x.opts.config, x.now())
}

// health returns the daemon's standard gRPC health status (service ""), or
// what went wrong asking for it.
func (x *cli) health(ctx context.Context) string {
	resp, err := healthpb.NewHealthClient(x.c.Conn()).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return "unknown (" + describeError(err) + ")"
	}
	return resp.GetStatus().String()
}

// listRequest builds the ListRooms request from the flags.
func (x *cli) listRequest() (*pb.ListRoomsRequest, error) {
	phases, err := parsePhases(x.opts.phases)
	if err != nil {
		return nil, err
	}
	limit := uint32(min(x.opts.limit, pb.MaxListLimit))
	if limit == 0 {
		limit = pb.MaxListLimit
	}
	return &pb.ListRoomsRequest{Phases: phases, BootstrapAddr: x.opts.prefill, LiveOnly: x.opts.live, Limit: limit, NewestFirst: !x.opts.oldest}, nil
}

// cmdRooms lists rooms with Rooms.ListRooms, once or, with --watch, every
// --interval.
func cmdRooms(ctx context.Context, x *cli, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	req, err := x.listRequest()
	if err != nil {
		return err
	}
	list := func(ctx context.Context) (*pb.ListRoomsResponse, error) {
		cctx, cancel := x.callCtx(ctx)
		defer cancel()
		resp, err := x.c.Admin().ListRooms(cctx, req)
		if err != nil {
			return nil, &callError{what: "rooms", err: err}
		}
		return resp, nil
	}
	if !x.opts.watch {
		resp, err := list(ctx)
		if err != nil {
			return err
		}
		if x.opts.json() {
			return writeJSON(x.stdout, resp)
		}
		return writeRoomList(x.stdout, resp, x.now())
	}
	return x.watch(ctx, list)
}

// cmdRoom prints one room and its timeline (Rooms.GetRoom): the room
// given, or with --latest (--latest-failed) the (failed) room opened last.
func cmdRoom(ctx context.Context, x *cli, args []string) error {
	var id uint64
	var err error
	if x.opts.latest || x.opts.latestFailed {
		id, err = x.latestRoom(ctx, args)
	} else {
		id, err = oneRoom(args)
	}
	if err != nil {
		return err
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	r, err := x.c.Admin().GetRoom(cctx, &pb.GetRoomRequest{Room: id, IncludePages: x.opts.pages})
	if err != nil {
		return &callError{what: fmt.Sprintf("room %d", id), err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, r)
	}
	return writeRoom(x.stdout, r, x.opts.pages, x.now())
}

// latestRoom finds the room --latest or --latest-failed names: the newest
// by open time (Rooms.ListRooms, newest first, limit 1), failed ones only
// with --latest-failed.
func (x *cli) latestRoom(ctx context.Context, args []string) (uint64, error) {
	flagName := "--latest"
	req := &pb.ListRoomsRequest{NewestFirst: true, Limit: 1}
	if x.opts.latestFailed {
		flagName = "--latest-failed"
		req.Phases = []pb.RoomPhase{pb.RoomPhase_ROOM_PHASE_FAILED}
	}
	switch {
	case x.opts.latest && x.opts.latestFailed:
		return 0, usagef("--latest and --latest-failed exclude each other")
	case len(args) > 0:
		return 0, usagef("%s picks the room: give no room ID (got %q)", flagName, args[0])
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	resp, err := x.c.Admin().ListRooms(cctx, req)
	if err != nil {
		return 0, &callError{what: "rooms", err: err}
	}
	if len(resp.GetRooms()) == 0 {
		if x.opts.latestFailed {
			return 0, fmt.Errorf("%s: no failed room at %s (finished rooms are kept for rooms.retention)", flagName, x.opts.addr)
		}
		return 0, fmt.Errorf("%s: no room at %s yet (make demo opens some)", flagName, x.opts.addr)
	}
	return resp.GetRooms()[0].GetRoom(), nil
}

// cmdAbort fails a room (Rooms.AbortRoom).
func cmdAbort(ctx context.Context, x *cli, args []string) error {
	id, err := oneRoom(args)
	if err != nil {
		return err
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	resp, err := x.c.Engine().AbortRoom(cctx, &pb.AbortRoomRequest{Room: id, Reason: x.opts.reason})
	if err != nil {
		return &callError{what: fmt.Sprintf("abort room %d", id), err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, resp)
	}
	return writeAbort(x.stdout, resp, id)
}

// cmdDrain drains the daemon (Admin.Drain) and lists the rooms in flight.
func cmdDrain(ctx context.Context, x *cli, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	resp, err := x.c.Admin().Drain(cctx)
	if err != nil {
		return &callError{what: "drain", err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, resp)
	}
	if err := writeDrain(x.stdout, resp); err != nil || resp.GetRoomsInFlight() == 0 {
		return err
	}
	// The drain is done; the listing is a courtesy, so its failure is a
	// warning, not the command's.
	cctx2, cancel2 := x.callCtx(ctx)
	defer cancel2()
	list, err := x.c.Admin().ListRooms(cctx2, &pb.ListRoomsRequest{LiveOnly: true, Limit: defaultLimit})
	if err != nil {
		fmt.Fprintf(x.stderr, "decodectl: warning: listing the rooms in flight: %s\n", describeError(err))
		return nil
	}
	fmt.Fprintln(x.stdout)
	return writeRoomList(x.stdout, list, x.now())
}

// cmdLookup resolves rooms to prefill DP ranks (Bootstrap.LookupDPRanks).
func cmdLookup(ctx context.Context, x *cli, args []string) error {
	if x.opts.prefill == "" {
		return usagef("--prefill ADDR is required (the prefill instance's bootstrap address)")
	}
	if len(args) == 0 && len(x.opts.hints) == 0 {
		return usagef("missing ROOM: give one or more room IDs")
	}
	req := &pb.LookupDPRanksRequest{BootstrapAddr: x.opts.prefill, Hints: x.opts.hints}
	for _, a := range args {
		id, err := parseRoomID(a)
		if err != nil {
			return err
		}
		req.Rooms = append(req.Rooms, id)
	}
	// The daemon applies a hint to the rooms asked about only: a hinted room
	// is asked about.
	for _, h := range x.opts.hints {
		if !slices.Contains(req.Rooms, h.GetRoom()) {
			req.Rooms = append(req.Rooms, h.GetRoom())
		}
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	resp, err := x.c.Engine().LookupDPRanks(cctx, req)
	if err != nil {
		return &callError{what: "lookup", err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, resp)
	}
	return writeLookup(x.stdout, resp)
}

// cmdVersion prints decodectl's version.
func cmdVersion(_ context.Context, x *cli, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	if x.opts.json() {
		b, err := json.MarshalIndent(map[string]string{"version": version}, "", "  ")
		if err != nil {
			return err
		}
		_, err = x.stdout.Write(append(b, '\n'))
		return err
	}
	_, err := fmt.Fprintln(x.stdout, buildinfo.Line("decodectl", version, commit))
	return err
}

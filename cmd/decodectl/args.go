package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// Defaults of the connection flags.
const (
	defaultAddr     = "127.0.0.1:7600"
	defaultTimeout  = 10 * time.Second
	defaultLimit    = 100
	defaultInterval = time.Second
)

// envFlags maps flags to the environment variables that set them when the
// flag is absent. The names are reserved by the daemon's configuration
// loader (it ignores them), so an operator's shell may export them.
var envFlags = []struct{ flag, env string }{
	{"addr", "DECODEPLANE_ADDR"},
	{"token", "DECODEPLANE_TOKEN"},
	{"tls-ca", "DECODEPLANE_TLS_CA"},
	{"tls-cert", "DECODEPLANE_TLS_CERT"},
	{"tls-key", "DECODEPLANE_TLS_KEY"},
	{"tls-server-name", "DECODEPLANE_TLS_SERVER_NAME"},
}

// options are every flag's value; each command reads the ones it declares.
type options struct {
	// Connection (every command).
	addr          string
	token         string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	timeout       time.Duration
	output        string

	// status
	config bool
	// rooms (and drain's listing)
	phases   string
	prefill  string // also lookup's
	live     bool
	oldest   bool
	limit    uint
	watch    bool
	interval time.Duration
	// room
	pages        bool
	latest       bool
	latestFailed bool
	// abort
	reason string
	// lookup
	hints hintList

	// set records the flags given on the command line, by name.
	set map[string]bool
}

// json reports whether -o json was asked for.
func (o *options) json() bool { return o.output == "json" }

// tlsEnabled reports whether the connection uses TLS: --tls, or any TLS file
// or server name.
func (o *options) tlsEnabled() bool {
	return o.tls || o.tlsCA != "" || o.tlsCert != "" || o.tlsKey != "" || o.tlsServerName != ""
}

// hintList is lookup's repeatable --hint ROOM=DP.
type hintList []*pb.RoomHint

// String implements flag.Value.
func (h *hintList) String() string { return "" }

// Set implements flag.Value: one ROOM=DP_RANK.
func (h *hintList) Set(v string) error {
	r, d, ok := strings.Cut(v, "=")
	if !ok {
		return fmt.Errorf("want ROOM=DP_RANK, got %q", v)
	}
	room, err := parseRoomID(r)
	if err != nil {
		return err
	}
	dp, err := strconv.ParseUint(strings.TrimSpace(d), 10, 32)
	if err != nil {
		return fmt.Errorf("bad DP rank %q in %q", d, v)
	}
	*h = append(*h, &pb.RoomHint{Room: room, DpRank: uint32(dp)})
	return nil
}

// registerGlobal declares the flags every command takes.
func registerGlobal(fs *flag.FlagSet, o *options) {
	fs.StringVar(&o.addr, "addr", defaultAddr, "")
	fs.StringVar(&o.token, "token", "", "")
	fs.BoolVar(&o.tls, "tls", false, "")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "")
	fs.StringVar(&o.tlsKey, "tls-key", "", "")
	fs.StringVar(&o.tlsServerName, "tls-server-name", "", "")
	fs.DurationVar(&o.timeout, "timeout", defaultTimeout, "")
	fs.StringVar(&o.output, "o", "text", "")
	fs.StringVar(&o.output, "output", "text", "")
}

// invocation is a parsed command line.
type invocation struct {
	// cmd is the command; nil when none was given.
	cmd *command
	// args are the command's positional arguments.
	args []string
	opts options
	// help is set by "help [COMMAND]", -h and --help.
	help bool
}

// usageError is a command-line mistake: exit code 2.
type usageError struct{ msg string }

// Error returns the message.
func (e *usageError) Error() string { return e.msg }

// usagef builds a usageError.
func usagef(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// newFlagSet builds cmd's flag set (the global flags and the command's own)
// bound to o. A nil cmd declares the global flags only.
func newFlagSet(cmd *command, o *options) *flag.FlagSet {
	name := "decodectl"
	if cmd != nil {
		name = cmd.name
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	registerGlobal(fs, o)
	if cmd != nil && cmd.flags != nil {
		cmd.flags(fs, o)
	}
	return fs
}

// takesValue reports whether the flag name (of any command) needs a value,
// which tells findCommand to skip the next argument. Unknown flags are
// reported by the command's own parse.
func takesValue(name string) bool {
	var o options
	for _, c := range commands {
		if f := newFlagSet(c, &o).Lookup(name); f != nil {
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
				return false
			}
			return true
		}
	}
	return false
}

// findCommand returns the index of the command word in args (the first
// argument that is neither a flag nor a flag's value), or -1.
func findCommand(args []string) int {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				return i + 1
			}
			return -1
		case len(a) > 1 && a[0] == '-':
			name := strings.TrimLeft(a, "-")
			if strings.Contains(name, "=") {
				continue
			}
			if takesValue(name) {
				i++
			}
		default:
			return i
		}
	}
	return -1
}

// parseArgs parses the command line: the command word may come anywhere
// among the flags, and flags may follow positional arguments.
func parseArgs(args, environ []string) (*invocation, error) {
	inv := &invocation{}
	rest := args
	if i := findCommand(args); i >= 0 {
		name := args[i]
		rest = append(append([]string(nil), args[:i]...), args[i+1:]...)
		if name == "help" {
			inv.help = true
			if j := findCommand(rest); j >= 0 {
				name = rest[j]
				if inv.cmd = lookupCommand(name); inv.cmd == nil {
					return inv, usagef("unknown command %q", name)
				}
			}
			return inv, nil
		}
		if inv.cmd = lookupCommand(name); inv.cmd == nil {
			return inv, usagef("unknown command %q", name)
		}
	}
	fs := newFlagSet(inv.cmd, &inv.opts)
	pos, err := parseInterspersed(fs, rest)
	if errors.Is(err, flag.ErrHelp) {
		inv.help = true
		return inv, nil
	}
	if err != nil {
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
			msg = "unknown flag " + flagName(name)
		}
		return inv, &usageError{msg: msg}
	}
	if inv.cmd == nil {
		return inv, nil // no command: usage
	}
	inv.args = pos
	inv.opts.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { inv.opts.set[f.Name] = true })
	if err := applyEnv(fs, &inv.opts, environ); err != nil {
		return inv, err
	}
	return inv, inv.opts.check(inv.cmd)
}

// flagName renders a flag name as the help spells it: -o, --addr.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// parseInterspersed parses fs over args, letting flags follow positional
// arguments; "--" ends the flags. It returns the positional arguments.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// applyEnv fills the flags that were not given from the environment: flags
// win over variables.
func applyEnv(fs *flag.FlagSet, o *options, environ []string) error {
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	// An explicit --tls=false turns off the TLS settings of the environment.
	plaintext := o.set["tls"] && !o.tls
	for _, ef := range envFlags {
		v, ok := env[ef.env]
		if !ok || v == "" || o.set[ef.flag] || (plaintext && strings.HasPrefix(ef.flag, "tls-")) {
			continue
		}
		if err := fs.Set(ef.flag, v); err != nil {
			return usagef("env %s: %v", ef.env, err)
		}
	}
	return nil
}

// check validates the options that do not depend on the daemon.
func (o *options) check(cmd *command) error {
	if o.output != "text" && o.output != "json" {
		return usagef("-o %q: want text or json", o.output)
	}
	if o.addr == "" {
		return usagef("--addr is empty")
	}
	if o.timeout <= 0 {
		return usagef("--timeout %s: must be positive", o.timeout)
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together (mutual TLS)")
	}
	if o.set["tls"] && !o.tls && o.tlsEnabled() {
		return usagef("--tls=false contradicts --tls-ca, --tls-cert, --tls-key and --tls-server-name")
	}
	if o.interval <= 0 && cmd.name == "rooms" {
		return usagef("--interval %s: must be positive", o.interval)
	}
	return nil
}

// parseRoomID parses a bootstrap room: an integer in [1, 2^63-1].
func parseRoomID(s string) (uint64, error) {
	id, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || id == 0 || id > 1<<63-1 {
		return 0, usagef("bad room ID %q: want an integer in [1, 2^63-1]", s)
	}
	return id, nil
}

// parsePhases parses --phase: comma-separated phase names as decodectl prints
// them (succeeded, resolving_dp_rank, ...), case-insensitive; "-" may stand
// for "_" and the ROOM_PHASE_ prefix may be given.
func parsePhases(s string) ([]pb.RoomPhase, error) {
	var out []pb.RoomPhase
	for _, part := range strings.Split(s, ",") {
		name := strings.ToLower(strings.TrimSpace(part))
		if name == "" {
			continue
		}
		name = strings.TrimPrefix(strings.ReplaceAll(name, "-", "_"), "room_phase_")
		p, ok := phaseByName(name)
		if !ok {
			return nil, usagef("--phase: unknown phase %q (phases: %s)", part, strings.Join(phaseNames(), ", "))
		}
		out = append(out, p)
	}
	return out, nil
}

// phaseByName finds the phase decodectl prints as name.
func phaseByName(name string) (pb.RoomPhase, bool) {
	for v := range pb.RoomPhase_name {
		p := pb.RoomPhase(v)
		if p != pb.RoomPhase_ROOM_PHASE_UNSPECIFIED && phaseName(p) == name {
			return p, true
		}
	}
	return 0, false
}

// phaseNames lists every phase name in lifecycle order.
func phaseNames() []string {
	var out []string
	for v := int32(1); ; v++ {
		if _, ok := pb.RoomPhase_name[v]; !ok {
			return out
		}
		out = append(out, phaseName(pb.RoomPhase(v)))
	}
}

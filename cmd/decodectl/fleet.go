package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	pb "github.com/decodeplane/decodeplane/proto/decodeplane/v1"
)

// fleetCommand is decodectl fleet.
var fleetCommand = &command{
	name: "fleet", daemon: true,
	summary: "the registry's decode daemons and prefill instances: incarnation, liveness, capacity (needs the token)",
	help: `  -o json         the Fleet.GetFleet answer

The registry line: memory, or etcd with its revision, key prefix and lease TTL; "degraded: REASON" while
etcd is unreachable. With the memory registry the daemon lists itself and the prefill instances
registered with it.
Daemons: address, SELF (the daemon that answered), incarnation (hex, new at every start), READY, tokens
FREE/TOTAL and QUEUE (rooms waiting for admission) summed over its shards, from the capacity it last
published ("-" before any), FINGERPRINT (the digest of what a prefill must match to hand off to it:
page size, KV dtype, pool kind, layers, heads or MLA dims, page owner, model; -o json has its fields).
Prefills: bootstrap address, instance id, RANKS registered/expected, TP/DP/PP/CP sizes, LIVENESS
("heartbeat": the memory registry; "lease": etcd, alive while its ranks heartbeat to any daemon), LEASE
(the etcd lease id, hex), HEARD HERE (the last heartbeat this daemon received from any of its ranks),
REGISTERED VIA (the daemon that created its record).
Hand-offs: for each prefill instance, the daemons whose fingerprint its layout matches (it can hand off
to them) and, for the others, what differs, as a registration through them would be refused.`,
	run: cmdFleet,
}

// cmdFleet prints Fleet.GetFleet.
func cmdFleet(ctx context.Context, x *cli, args []string) error {
	if err := noArgs(args); err != nil {
		return err
	}
	cctx, cancel := x.callCtx(ctx)
	defer cancel()
	f, err := x.c.Admin().GetFleet(cctx)
	if err != nil {
		return &callError{what: "fleet", err: err}
	}
	if x.opts.json() {
		return writeJSON(x.stdout, f)
	}
	return writeFleet(x.stdout, f, x.now())
}

// writeFleet renders Fleet.GetFleet: the registry line, the daemons, the
// prefill instances.
func writeFleet(w io.Writer, f *pb.GetFleetResponse, now time.Time) error {
	if _, err := fmt.Fprintf(w, "Registry: %s\n\n", formatRegistry(f.GetRegistry(), now)); err != nil {
		return err
	}
	if len(f.GetDaemons()) == 0 {
		fmt.Fprintln(w, "No decode daemons in the registry.")
	} else if err := writeFleetDaemons(w, f.GetDaemons()); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if len(f.GetPrefills()) == 0 {
		fmt.Fprintln(w, "No prefill instances in the registry.")
	} else {
		if err := writeFleetPrefills(w, f.GetPrefills(), now); err != nil {
			return err
		}
		if err := writeHandOffs(w, f); err != nil {
			return err
		}
	}
	if f.GetTruncated() {
		_, err := fmt.Fprintf(w, "(truncated: the daemon lists at most %d daemons and %d prefill instances)\n", maxFleetEntries, maxFleetEntries)
		return err
	}
	return nil
}

// maxFleetEntries is the daemon's bound on each list (server.MaxFleetEntries).
const maxFleetEntries = 10000

// formatRegistry renders the registry's state on one line: "memory, ok
// since <time> (<age> ago)"; etcd adds its revision, prefix and lease TTL,
// and a degraded state its reason.
func formatRegistry(r *pb.RegistryState, now time.Time) string {
	if r == nil {
		return "- (the daemon did not say)"
	}
	var b strings.Builder
	b.WriteString(dash(r.GetBackend()))
	b.WriteString(", " + dash(r.GetState()))
	if reason := r.GetReason(); reason != "" {
		b.WriteString(": " + reason)
	}
	if isSet(r.GetSince()) {
		fmt.Fprintf(&b, " since %s (%s ago)", timestamp(r.GetSince()), age(r.GetSince(), now))
	}
	if r.GetBackend() == "etcd" || r.GetRevision() != 0 || r.GetPrefix() != "" || r.GetLeaseTtl() != nil {
		fmt.Fprintf(&b, "; revision %d, prefix %s, lease ttl %s", r.GetRevision(), dash(r.GetPrefix()), r.GetLeaseTtl().AsDuration())
	}
	return b.String()
}

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// writeFleetDaemons renders one line per decode daemon. Its readiness,
// tokens and queue depth come from its last published capacity ("-"
// before any), tokens and queue summed over its shards.
func writeFleetDaemons(w io.Writer, daemons []*pb.FleetDaemon) error {
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "DAEMON\tSELF\tINCARNATION\tREADY\tVERSION\tTOKENS FREE/TOTAL\tQUEUE\tFINGERPRINT\n")
		for _, d := range daemons {
			ready, tokens, queue := "-", "-", "-"
			if c := d.GetCapacity(); c != nil {
				ready = yesNo(c.GetReady())
				if r := c.GetReadiness(); r != "" {
					ready += " (" + r + ")"
				}
				var free, total, q uint64
				for _, s := range c.GetShards() {
					free += s.GetTokensFree()
					total += s.GetTokensTotal()
					q += uint64(s.GetQueueDepth())
				}
				tokens, queue = fmt.Sprintf("%d/%d", free, total), fmt.Sprint(q)
			}
			fmt.Fprintf(tw, "%s\t%s\t%x\t%s\t%s\t%s\t%s\t%s\n", dash(d.GetAddress()), yesNo(d.GetSelf()), d.GetIncarnation(),
				ready, dash(d.GetVersion()), tokens, queue, dash(d.GetFingerprint().GetDigest()))
		}
	})
}

// writeFleetPrefills renders one line per prefill instance.
func writeFleetPrefills(w io.Writer, prefills []*pb.FleetPrefill, now time.Time) error {
	return table(w, func(tw io.Writer) {
		fmt.Fprint(tw, "PREFILL\tINSTANCE\tRANKS\tTP/DP/PP/CP\tLIVENESS\tLEASE\tHEARD HERE\tREGISTERED VIA\n")
		for _, p := range prefills {
			lease := "-"
			if id := p.GetLeaseId(); id != 0 {
				lease = fmt.Sprintf("%x", id)
			}
			heard := "-"
			if isSet(p.GetHeardHere()) {
				heard = age(p.GetHeardHere(), now) + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%d/%d/%d/%d\t%s\t%s\t%s\t%s\n", dash(p.GetBootstrapAddr()), dash(p.GetInstanceId()),
				p.GetRegisteredRanks(), p.GetExpectedRanks(), p.GetAttnTpSize(), p.GetDpSize(), p.GetPpSize(), p.GetAttnCpSize(),
				dash(p.GetLiveness()), lease, heard, dash(p.GetRegisteredVia()))
		}
	})
}

// writeHandOffs renders, per prefill instance, the daemons it can hand off
// to and those it cannot with why, joining each instance's fingerprint
// digests with the daemons that publish them. Nothing is printed when the
// daemon computed no hand-off (no fingerprints, or too large a fleet).
func writeHandOffs(w io.Writer, f *pb.GetFleetResponse) error {
	byDigest := map[string][]string{}
	for _, d := range f.GetDaemons() {
		if dg := d.GetFingerprint().GetDigest(); dg != "" {
			byDigest[dg] = append(byDigest[dg], d.GetAddress())
		}
	}
	var lines []string
	for _, p := range f.GetPrefills() {
		var to []string
		for _, dg := range p.GetHandOffDigests() {
			to = append(to, byDigest[dg]...)
		}
		if len(to) > 0 {
			lines = append(lines, fmt.Sprintf("%s can hand off to %s", p.GetBootstrapAddr(), strings.Join(to, ", ")))
		} else if len(p.GetRefused()) > 0 {
			lines = append(lines, fmt.Sprintf("%s can hand off to no daemon of the fleet", p.GetBootstrapAddr()))
		}
		for _, r := range p.GetRefused() {
			if addrs := byDigest[r.GetDigest()]; len(addrs) > 0 {
				lines = append(lines, fmt.Sprintf("%s cannot hand off to %s: %s", p.GetBootstrapAddr(), strings.Join(addrs, ", "), r.GetDifferences()))
			}
		}
	}
	if len(lines) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "\nHand-offs:\n%s\n", strings.Join(lines, "\n"))
	return err
}

// Package faults is decodeplane's fault-scenario suite: named, repeatable
// faults that users of prefill/decode disaggregation report, each run
// against the real binaries (the daemon, the reference transfer agent, the
// development etcd) with a simulated decode engine and prefill fleet driving
// real gRPC, each with its pass criteria. `decodeplane faults` runs it
// (cmd/decodeplane-faults, its own binary, so that the daemon links none
// of it); `make faults` runs every scenario's full variant; the package's
// test runs every scenario's short variant under `make test`.
//
// Every scenario checks the same things once its fault is over:
//
//   - every room it opened reached a terminal state (RELEASED or FAILED, as
//     the decode engine's EngineSession reported it; a room that died with
//     a daemon killed under it ends when the engine learns the new
//     incarnation) within the scenario's stated bound of the later of its
//     opening and the fault;
//   - no page held twice: sampled while the fault is active and at the
//     end, every room that holds pages (GetRoom with its pages) holds its
//     own, and at the end each shard's pool is whole again;
//   - the reuse invariant: decodeplane_page_reuse_violations_total of
//     every daemon (scraped before it is stopped or killed, and at the
//     end) is 0 — the daemon's own check that no page, row or slot was
//     handed to a room while a writer of its previous room could land;
//   - log lines bounded independently of the number of rooms: the lines
//     the daemons and agents wrote during the scenario at INFO and above,
//     against a fixed bound (Variant.Logs) that does not grow with the
//     rooms: what fails many rooms at once is logged once per cause per
//     interval with a count;
//   - the abort → pages-reusable latency: from the engine's AbortRoom to
//     the room's event with pages_reusable, p50 and p99, bounded where the
//     scenario states it.
//
// Each scenario adds its own checks (the cause of the failures, what must
// go on working during the fault). A scenario is one function over a Stage,
// which starts the processes, holds the engines and prefills, samples the
// pages and collects the figures; Run prints one line per scenario (PASS or
// FAIL, the figures, the reasons).
package faults

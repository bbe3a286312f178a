// Package staging is decodeplane's staging handler (SGLang's
// DecodeStagingHandler): the rings through which a prefill of
// another attention TP size hands its KV to the decode side, and the regions
// staged rooms hold in them.
//
// # What it owns
//
// Per (decode DP shard, decode TP rank) a ring (Ring: SGLang's
// StagingAllocator, ring + overcommit) of RingBytes, made on first use, its
// byte accounting and its watermark, and the watchers of that watermark
// (Watch, behind WatchWatermark). Per staged room (Room, one per attempt)
// the regions of its chunks, one per (chunk, decode TP rank, decode PP
// stage), shared by all the region's writers: which writers reported, the
// page offset they reported, the metadata the last chunk carried, and the
// region's scatter (idle, in flight, done). And the plan arithmetic from
// plain numbers: the decode PP stage a prefill PP rank writes to (Stage),
// the writers of a region with their head slices, layers and bytes per
// token (Writers), SGLang's compute_staging_layout (ComputeLayout) and
// is_watermark_ready (WatermarkReady).
//
// # What it does not
//
// It knows nothing of rooms beyond the numbers it is given: it imports
// neither kvmanager nor the prefill registry (deps_test.go); the head slices
// of its writers come from the engine contract's
// transfer.ComputeHeadSliceParams, the formula the registry plans
// destinations with. The
// room manager (kvmanager.Manager) decides whether a rank may stage into a
// room now (its phase, its plan, the rank's claim), runs the engine's
// scatter, moves the room's success gate and coverage, fails the room, and
// arms the completion timeout on its one deadline heap. This package
// answers with effects for it to apply: the region a writer gets
// (Allocate), a *TooLargeError whose Msg the room fails with, a
// *FieldError naming the request field that contradicts a region, the
// regions ready to scatter (Ready) and what a scatter moves
// (StartScatter), whether regions are still pending or due (Pending,
// ScattersDue, Missing for the timeout's message), and the regions a
// release freed (Release).
//
// # A region goes back once
//
// A region returns to its ring exactly once: when its scatter is over
// (EndScatter with free: it landed, failed for good, or the room ended
// while it ran) or when its room is released (Release), whichever comes
// first; the other finds it freed. A scatter that failed with nothing
// landed (EndScatter without free) keeps the region for a retried report.
// The caller guarantees the rest of the rule: it calls Release only when no
// scatter of the room is in flight and no write the daemon runs can still
// land in the region (kvmanager releases a room's resources only after its
// in-flight operations returned).
//
// # Concurrency
//
// A Stager has its own mutex, a leaf: the Manager takes it after its own,
// and nothing is called while it is held. Every method that reads or
// changes a ring, a watch or a region takes it (the plan arithmetic — Stage,
// Writers, Room.Stage — reads only what New and Open fixed), so a Watch's
// Next and Close need no lock of the Manager. The *Room and *Staged handles
// are opaque; only the Stager reads or changes what is behind them.
package staging

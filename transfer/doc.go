// Package transfer is the transfer-engine contract the room manager
// (kvmanager) consumes, and the home of the engines under it: transfer/sim
// (the simulated engine, the embedded default), transfer/delegate (the
// engine that drives an external transfer agent), transfer/kvcopy (the byte
// layout of KV buffers and the copy batches), transfer/hostmem (the
// reference agent's host-memory buffers) and the agent protocol's two ends,
// transfer/agentclient and transfer/agentservice, with transfer/agentwire
// between them.
//
// This package owns what both sides of the seam share and nothing else:
//
//   - Engine (Transfer one chunk), the optional capabilities Scatterer
//     (scatter a staged region; staging needs it) and ChunkChecker (refuse a
//     chunk's source before the manager records it; errors are *FieldError,
//     answered as an invalid argument naming the field);
//   - the operations and their results: ChunkOp (one chunk of one prefill
//     Rank's KV, with its decode Targets), ScatterOp with its ScatterWriters,
//     ChunkSource, ChunkResult;
//   - the engine errors the manager classifies: ErrTransferFailed (the
//     chunk failed, the room fails), ErrEngineUnavailable (nothing was
//     written, the chunk may be sent again) and WritesMayContinueError (the
//     outcome is unknown: the room's pages stay out of use until Until);
//   - the byte-weight math both the manager (which checks a reported byte
//     count and tells prefills their weights) and the engines need:
//     StageLayers, RankWeights and ChunkBytes.
//
// It imports only prealloc (the decode layout) and never kvmanager or an
// engine (deps_test.go); which engine runs is the composition root's
// choice (internal/daemon, from internal/config's transfer section).
package transfer

// Package sim is the simulated transfer engine, the embedded default
// (transfer.path: sim): SimEngine implements transfer.Engine and
// transfer.Scatterer without moving bytes. A chunk or a staged region takes
// latency + bytes / bandwidth on the injected clock (kvlayout.Clock), its
// bytes computed from the decode layout (transfer.ChunkBytes, ScatterOp.Bytes);
// a last chunk carrying the room marker, and a scatter carrying it, report
// it as written. Faults are injected by
// probability (SimConfig.FailureProbability, SGLang's
// SGLANG_TEST_DISAGG_FAILURE_PROB, seeded by SimConfig.Seed) or
// deterministically for tests (SetFault, SetScatterFault). SimConfig is the
// transfer.sim section of the configuration.
package sim

// Package kvlayout describes what a decode instance is, as every layer of
// decodeplane shares it: the KV pool's kind (MHA, GQA, MLA and the hybrids)
// and its per-request state components, the decode configuration (pool,
// SWA and Mamba sizes, the parallel layout, the staging ring, the admission
// settings the allocator reads), its validation against SGLang's startup
// rules (ConfigError, Warning) and the per-rank byte geometry (Layout) a
// transfer engine sizes copies with.
//
// It also holds the two small values the domain passes across package
// lines: Invalid, the one bad-field error that the room manager, the
// prefill registry, the staging handler and the transfer engines report
// and the inbound API answers as InvalidArgument; and Clock, the injected
// source of time (RealClock, which is the virtual clock inside a
// testing/synctest bubble, Sleep on a Clock and a Ticker driven by one).
//
// It is a leaf: it imports only the standard library. The allocator
// (prealloc), the room manager (kvmanager), the transfer engines and the
// configuration loader build on it.
package kvlayout

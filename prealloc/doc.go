// Package prealloc is decodeplane's KV ledger and admission engine: a pure
// domain package that reimplements the memory side of SGLang's decode
// pre-allocation (DecodePreallocQueue, DecodeReqToTokenPool,
// ReqToMetadataIdxAllocator and the paged / SWA / Mamba allocators) for one
// decode data-parallel shard. It has no network code and reads time only
// through the injected Clock.
//
// # What the ledger owns
//
// A Ledger is the allocator of record of one shard. It owns:
//
//   - KV pages 0..N-1 (kv_pool.total_pages, or total_tokens / page_size). Page
//     0 is a normal page. Pages are handed out from a LIFO free list of int32;
//     allocating or freeing a request's pages is O(pages) with no heap
//     allocation in steady state (the per-room page lists are recycled in
//     power-of-two buckets).
//   - req_to_token rows 1..request_slots+pre_alloc_slots; row 0 is padding,
//     as in DecodeReqToTokenPool (size + pre_alloc_size + 1 rows). Rows are
//     reused FIFO.
//   - metadata (aux) slots 0..M-1, reused FIFO like ReqToMetadataIdxAllocator's
//     deque. Each slot carries a room marker (what prefill wrote into its
//     bootstrap_room row, recorded with SetMetadataMarker) that is reset to
//     0 whenever the slot is freed (SGLang PR #27374), so a new owner never
//     reads a stale room.
//   - hybrid-swa: the SWA pool's pages. With a page size > 1 only the
//     page-aligned sliding-window tail is pre-allocated
//     (alloc_extend_swa_tail); with page size 1 every full token also takes
//     an SWA token, as SGLang's non-tail fallback does.
//   - hybrid-linear: Mamba state slots, slots_per_req per request
//     (1 + ping_pong with the extra buffer, else 1). The first is the main
//     slot sent to prefill; the others are the ping-pong track slots.
//
// The decode radix cache, HiCache, HiSparse and speculative hidden-state
// pools are not modelled: prefix_len is always 0.
//
// # Lifecycle of a room
//
//	Enqueue ──► waiting ──SetReady──► ready ──Admit──► admitted ──Claim──► claimed
//	                ▲                                      │                  │
//	                │                              Expire (deadline)   StartRunning
//	            ResumeHeld                                 ▼                  ▼
//	                │                                  (released)          running ◄──┐ ◄── Adopt
//	              held ◄───────────────Hold────────────────────────────────  │ │      │
//	                                                               Retract ──┘ │  UpdateRunning
//	                                           retracted ──Admit──► resumed ───┘ StartRunning
//
//	admitted, claimed, resumed, running ──DrainRoom──► draining ──Release──► (released)
//
// Release ends a room from any state and frees exactly what it holds; a
// second release is ErrUnknownRoom, never a double free. Waiting, ready,
// retracted and held rooms hold nothing. An admitted room holds a req slot,
// a metadata slot, pages for fill_len and its state slots, and (with
// admission.claim_timeout) a claim deadline after which Expire releases it.
// StartRunning frees the metadata slot (pop_transferred) and keeps the rest.
// Retract and Hold free everything at once (the engine keeps a CPU copy, or
// prefill recomputes). Admission passes resume retracted rooms first — but,
// while rooms are running, not before the next UpdateRunning (the engine's
// next decode-step report), so that the running rooms grow into the freed
// pages first, as in SGLang where the retracting step runs before the next
// process_decode_queue. Held rooms wait for ResumeHeld, which re-enqueues
// them as rebootstrap requests needing a new handshake.
//
// # Draining rooms (deferred release)
//
// A room that ends while a prefill rank may still be writing into its pages
// by itself (abort, failure, timeout: the deferred release) must not give them back
// yet. DrainRoom moves an admitted, claimed, resumed or running room to
// RoomDraining: it keeps exactly its pages, SWA pages, req slot, Mamba
// slots and, if it has one (drained while admitted or claimed), its
// metadata slot and marker — prefill may still write the aux row too. It
// leaves the claim deadline heap and the running set and is no request any
// more: every other operation on it is ErrWrongState (DrainRoom again is a
// no-op), reads (State, Allocation: every page it holds, MetadataMarker)
// still answer. Release frees everything once; the caller decides when
// (every rank acknowledged, or its bound expired). A room that holds
// nothing cannot drain (ErrWrongState): it is simply released. Stats counts
// draining rooms (Stats.Draining) and what they hold in each pool
// (ResourceStats.Draining, part of Used). Drain (no argument) is unrelated:
// it stops the whole ledger taking new rooms.
//
// # Adopted rooms (engine resync)
//
// After a daemon restart the decode engine re-declares the rooms it still
// runs. Adopt (AdoptEntry) makes each a running room owning exactly what
// the engine names (Adoption): its req_to_token row (the engine's own row:
// its req_pool_indices keep pointing at it), its pages —
// ceil((prompt + output) / page_size) of them, the pages a running room of
// that length holds — and per kind its live SWA pages (covering at least
// the window, floor(max(0, seq − window) / page_size) on) or its
// slots_per_req Mamba slots. A page or slot out of range, named twice or
// held by another room (ErrOwned names the index and the room), a taken or
// out-of-range row, an existing room, a wrong page count or missing state
// slots refuse the whole adoption and change nothing. Adopted rooms are
// then running rooms like any other (UpdateRunning, Retract, Hold,
// DrainRoom, Release) and count in the budget. The free lists are indexed
// by item (pageStack.pos, slotRing.pos), so checking and taking the adopted
// items is O(items), not O(pool); taking a specific free item moves one
// other free item into its place (the stack's top, or the ring's next pop),
// the others keep their order.
//
// # Admission and the budget
//
// Enqueue refuses, with SGLang's messages, a request that could never be
// admitted: SGLang's entry check (origin_len ≤ max_total_num_tokens, and the
// SWA tail ≤ size_swa) plus the admission test below evaluated on an empty
// shard, max(page_round(fill_len) + R, origin_len + min(max_new, CLIP)) ≤
// max_total_num_tokens (and swa_tail + min(max_new, CLIP) ≤ size_swa). Every
// request that enters the queue fits once the shard drains.
//
// Admit is one pass of SGLang's process_decode_queue. With R the reserved
// decode tokens per active request and CLIP the max_new_tokens clip:
//
//   - retractable = Σ over running rooms of (prompt + output).
//   - need_single = max over running rooms of (min(max_new, CLIP) + prompt)
//     − retractable, or 0 with no running room: the space the largest
//     running request could still need if every other one were retracted.
//   - active = running + admitted + claimed + resumed rooms (SGLang's
//     running batch, transfer queue and waiting queue; rooms admitted earlier
//     in the same pass count as SGLang's extra_reserved_reqs). Adopted rooms
//     are running rooms. Draining rooms are not active requests (no R
//     reserved for them, not retractable, no need_single term): their
//     pages, SWA pages and slots are simply not free, so they count as used
//     in every "free" term below, and the budget stays SGLang's.
//   - full_budget = free full-pool tokens − max(R × active, need_single)
//     − Σ over retracted rooms of (fill_len + R).
//   - fill_len = prompt + max(output − 1, 0); a rebootstrap has no −1.
//     The room needs required = page_round(fill_len) + R, and it fits when
//     max(required, origin_len + min(max_new, CLIP) − retractable) ≤ full_budget,
//     where origin_len is the prompt (plus the output for a rebootstrap).
//     After each admission the budget is recomputed from the pool.
//   - hybrid-swa (page size > 1) also needs
//     max(swa_tail, swa_tail + min(max_new, CLIP) − retractable_swa) ≤ swa_budget,
//     where the SWA reservation is capped by the window growth potential
//     min(R × active, max(0, active × window − swa_used)); the SWA budget is
//     decremented by swa_tail per admission.
//   - hybrid-linear needs slots_per_req free Mamba slots (minus those the
//     retracted rooms will need).
//
// The pass first resumes retracted rooms in retraction order (budget
// without need_single and without retracted needs, decremented per resumed
// room); while any retracted room remains nothing new is admitted. It then
// admits ready rooms in queue order — FIFO, or by priority (low-first or
// high-first) then FIFO — stopping at the first shortage (req slot, metadata
// slot, Mamba, tokens, SWA) and returning it as the BlockReason. Rooms still
// waiting for their handshake are skipped. With admission.max_bypass = N > 0
// a room that does not fit the token or SWA budget is stepped over (at most
// 8 per pass) while fewer than N later rooms have been admitted ahead of it;
// after N it blocks its queue strictly (SGLang's rule, N = 0) until the
// shard drains enough for it. So a room too big for a busy shard neither
// stalls the rooms behind it indefinitely nor starves. The ready rooms live
// in an indexed heap keyed by (priority class, arrival), so a blocked pass
// looks only at the head (strict, or a budget below R where nothing fits)
// or at most 9 rooms (bypass): O(1) or O(log n) in the queue length;
// admitting k rooms costs O(k log n) plus their pages. The running-set terms
// (retractable, need_single and their SWA analogues) and the retracted
// requirements are maintained incrementally.
//
// # Growth of running rooms
//
// UpdateRunning(room, outputLen) keeps prompt + outputLen tokens backed by
// pages (the KV the next decode step writes) and returns the pages added
// when a page boundary is crossed. On a hybrid-swa pool it adds the matching
// SWA pages and frees, eagerly, the SWA pages of tokens before
// page_floor(seq − 1 − window − page_size) (ScheduleBatch._evict_swa; the
// engine evicts periodically, the ledger at once).
//
// # Thread safety
//
// Every method takes the ledger's single mutex; a Ledger may be shared by
// any number of goroutines.
//
// # Ownership of returned slices
//
// The slices inside an Allocation (Pages, State[i].Indices, MambaPingPong,
// and the State slice itself for admitted, claimed and resumed rooms) and
// the slice returned by UpdateRunning are owned by the ledger and are not
// copied. They stay valid and unchanged while the room holds its resources:
// until it is released (Release, Expire) or gives its resources up (Retract,
// Hold); a draining room still holds them. Adopt copies the caller's slices. Growth never moves or rewrites pages already returned. After that
// the ledger reuses the memory; copy anything you need to keep longer.
// Callers must not modify them.
package prealloc

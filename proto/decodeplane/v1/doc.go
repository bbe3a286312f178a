// Package decodeplanev1 is the generated Go code of decodeplane's public API
// (protobuf package decodeplane.v1: Admin, Bootstrap, Rooms, Staging,
// Capacity, Fleet, PrefillSession), plus the hand-written Validate methods
// that the server's validator interceptor enforces (a PrefillRequest has
// none on purpose: the session's handler validates each op, see
// prefill_session_validate.go). Regenerate with `make proto`;
// `make proto-check` fails when the checked-in code is stale.
package decodeplanev1

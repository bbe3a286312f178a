// Package decodeplanev1 is the generated Go code of decodeplane's public API
// (protobuf package decodeplane.v1: Admin, Bootstrap, Rooms, Staging,
// Capacity, Fleet), plus the hand-written Validate methods that the
// server's validator interceptor enforces. Regenerate with `make proto`;
// `make proto-check` fails when the checked-in code is stale.
package decodeplanev1

// Package ops is decodeplane.v1's operation table (Table): every
// operation of the API defined once — its request's checks (the message's
// Validate and the incarnation check), its auth class, its span name and
// metrics label (its gRPC method), the domain call and the mapping of its
// answer and its errors (Table.Status, the one place where domain errors
// become statuses) — and the gRPC services built from it (grpc.go).
//
// Every transport is an adapter over the table: the gRPC server registers
// the table's services and authorizes each call with Table.Authorize in
// its interceptor; the sessions (package session) run the same ops one by
// one (CheckAs, then Call, or the ops' session forms: AwaitDestinationFunc,
// WatchFunc, TransferAsync); the JSON gateway (package gateway) runs the
// table's services in process under the gRPC server's interceptors; and
// SGLang's HTTP routes (package httpboot) call the Bootstrap ops.
//
// Each group of ops holds only the room manager's methods it calls
// (manager.go: EngineRooms, RoomReader, PrefillRooms, Bootstrapper, Stager,
// StatusReader), not the manager itself.
package ops

// Package benchv1 is the generated Go code of decodeplane.bench.v1: the
// service that does nothing (empty unary calls and server streams, padded
// messages echoed on a bidirectional stream) which `decodeplane bench`
// serves on a separate server to measure the bare-gRPC limit it compares
// the control path with. The daemon never registers it.
package benchv1

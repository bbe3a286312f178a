"""Generated protobuf and gRPC stubs of ``decodeplane.bench.v1``."""

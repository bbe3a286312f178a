"""Generated protobuf and gRPC stubs of ``decodeplane.transfer.v1`` (the transfer agent's API)."""

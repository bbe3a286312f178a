"""Generated stubs of the bench's bare-gRPC reference service (``decodeplane.bench``)."""

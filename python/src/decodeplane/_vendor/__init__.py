"""Wire-compatible copies of the ``google.rpc`` status messages (see rpc_status.proto)."""

"""Generated stubs of decodeplane's transfer agent protocol (``decodeplane.transfer``)."""

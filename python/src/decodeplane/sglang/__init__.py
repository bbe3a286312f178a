"""decodeplane as an SGLang transfer backend: ``--disaggregation-transfer-backend
decodeplane`` on SGLang's prefill and decode servers hands every request's KV
off through a decodeplane daemon (see docs/sglang.md in the repository).

SGLang loads it through its plugin system: the entry point
``decodeplane = decodeplane.sglang.plugin:register`` of the group
``sglang.srt.plugins`` (``SGLANG_PLUGINS`` may list it). Importing this
package imports nothing of SGLang or gRPC.
"""

from sglang.srt.disaggregation.mooncake.conn import (  # noqa: F401
    MooncakeKVBootstrapServer,
    MooncakeKVManager,
    MooncakeKVReceiver,
    MooncakeKVSender,
)

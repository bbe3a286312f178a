"""Stand-in of a backend without a plugin (Mooncake): its classes only, so
that get_kv_class's other branches resolve as before."""

from sglang.srt.disaggregation.common.conn import (
    CommonKVBootstrapServer,
    CommonKVManager,
    CommonKVReceiver,
    CommonKVSender,
)


class MooncakeKVManager(CommonKVManager):
    pass


class MooncakeKVSender(CommonKVSender):
    pass


class MooncakeKVReceiver(CommonKVReceiver):
    pass


class MooncakeKVBootstrapServer(CommonKVBootstrapServer):
    pass

from sglang.srt.disaggregation.fake.conn import FakeKVManager, FakeKVReceiver, FakeKVSender  # noqa: F401

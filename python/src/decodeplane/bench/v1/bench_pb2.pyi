from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class Empty(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class SessionMessage(_message.Message):
    __slots__ = ["payload", "replies", "reply_bytes", "tag"]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REPLIES_FIELD_NUMBER: _ClassVar[int]
    REPLY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    replies: int
    reply_bytes: int
    tag: int
    def __init__(self, tag: _Optional[int] = ..., replies: _Optional[int] = ..., reply_bytes: _Optional[int] = ..., payload: _Optional[bytes] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ["count"]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

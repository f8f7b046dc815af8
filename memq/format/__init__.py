"""memq.format: pure encode/decode of LogMessage, Message, Batch and Notification (no I/O).

Every decoder is total: bad bytes raise CorruptDataError, UnsupportedVersionError or
UnsupportedCodecError naming what was wrong.
"""

from memq.format.batch import (
    BATCH_PREFIX_SIZE,
    BatchHeader,
    batch_header_size,
    decode_batch,
    decode_batch_header,
    encode_batch,
    iter_batch_messages,
    object_crc32c,
    split_parts,
)
from memq.format.codec import MAX_BODY_BYTES, Codec, Compressors
from memq.format.message import (
    MESSAGE_HEADER_SIZE,
    MessageHeader,
    decode_message,
    decode_message_header,
    encode_message,
    verify_message,
)
from memq.format.notification import NOTIFICATION_VERSION, Notification
from memq.format.records import LogMessage

__all__ = [
    "BATCH_PREFIX_SIZE", "MAX_BODY_BYTES", "MESSAGE_HEADER_SIZE", "NOTIFICATION_VERSION",
    "BatchHeader", "Codec", "Compressors", "LogMessage", "MessageHeader", "Notification",
    "batch_header_size", "decode_batch", "decode_batch_header", "decode_message",
    "decode_message_header", "encode_batch", "encode_message", "iter_batch_messages",
    "object_crc32c", "split_parts", "verify_message",
]

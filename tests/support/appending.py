"""Appending to a TopicProcessor as a door does, with the ack split by when it came."""

from __future__ import annotations

from collections.abc import Callable

from memq.broker.processor import TopicProcessor
from memq.format import verify_message
from memq.format.wire import Ack, AckLevel


async def append(proc: TopicProcessor, data: bytes, request_id: int, level: AckLevel,
                 later: Callable[[Ack], None], *, seal: bool = False) -> Ack | None:
    """The ack `proc.append` gave during the call (ack=1, a refusal, a stored duplicate's), or
    None when it comes later through `later` (ack=all) or is not sent (an ack=0 success)."""
    now: list[Ack] = []
    during = True

    def reply(ack: Ack) -> None:
        (now.append if during else later)(ack)

    await proc.append(memoryview(data), verify_message(data), request_id, level, reply, seal=seal)
    during = False
    if not now or (level is AckLevel.NONE and now[0].ok):
        return None
    return now[0]

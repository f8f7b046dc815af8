"""A topic's fill being filled by a TopicProcessor and stored by its GroupWriter, and what became of it.

The public types that cross from the processor (which fills batches and acks their Messages)
to the group writer (which stores and announces them): the writer never sees a processor's
internals, only a `Fill` (what one batch slot of a topic holds: a `Batch` per read partition
written, each stored as a part and published to its partition), and answers each batch with one
`Outcome`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from memq.errors import NotifyError
from memq.format import MessageHeader, Notification
from memq.format.wire import Ack, AckCode

#: Called once with the outcome of one appended Message (see `TopicProcessor.append`).
Reply = Callable[[Ack], None]


@dataclass(slots=True)
class Batch:
    """One read partition's batch of a topic: verified Message frames, their headers, and who
    waits for the acks; stored as one part, its notification published to `partition`."""

    partition: int
    messages: list[memoryview] = field(default_factory=list)
    headers: list[MessageHeader] = field(default_factory=list)
    # ack=all: (request id, Message index, index of its first LogMessage, reply)
    waiters: list[tuple[int, int, int, Reply]] = field(default_factory=list)
    nbytes: int = 0
    logcount: int = 0


@dataclass(slots=True)
class Fill:
    """What one batch slot of a topic holds: a batch per read partition written to since it
    opened, sealed together (its limits, `batch_bytes`, `batch_messages`, `batch_ms`, count
    the fill, so objects and PUTs do not grow with partitions)."""

    opened: float                # clock.monotonic() when the fill was opened
    batches: dict[int, Batch] = field(default_factory=dict)   # by read partition, in the order opened
    nbytes: int = 0
    logcount: int = 0
    sticky: int = -1             # where Messages naming no partition go in this fill (-1: not chosen yet)
    timer: asyncio.TimerHandle | None = None
    held: bool = False           # past batch_ms, under min_batch_bytes: filling until max_batch_ms
    slot_returned: bool = False  # a small shared-group fill: its slot was given back when taken


@dataclass(frozen=True, slots=True)
class Stored:
    """The batch is a part of a stored object; `published` is its notification's (partition,
    offset) on Kafka, or why publishing failed (the object is kept: it may still land)."""

    note: Notification
    published: tuple[int, int] | NotifyError
    put_s: float
    notify_s: float


@dataclass(frozen=True, slots=True)
class Failed:
    """The batch's object could not be stored: every ack=all Message of it fails with `code`."""

    code: AckCode
    why: str


Outcome = Stored | Failed

"""Which way a Consumer reads a part, and through which brokers (pure: no I/O).

A part near the tail is read through a broker: the broker that stored it still holds it in its
read cache (no GET at all), and any other broker GETs it once however many groups ask (single
flight), so readers cost bytes, not requests. A part far behind the tail is read from storage
directly: no broker has it hot any more, a catch-up reader would only add a hop and push the
tail's parts out of the brokers' caches, and large sequential GETs are what S3 is cheap at.

Brokers are tried in an order every reader of the part computes alike (so different groups
meet at the same broker and share its cache): the part's writer first, then the others by
rendezvous hash of the object key; with a rack named, brokers of that rack before the rest.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from memq.format.metadata import BrokerMetadata

ReadPath = Literal["auto", "broker", "s3"]
Way = Literal["broker", "s3"]


@dataclass(frozen=True)
class PathRule:
    """`auto`: through a broker while the part is at most `max_age_ms` old (by its notification's
    `created_ms`), from storage after; `broker` and `s3` always that way."""

    mode: ReadPath
    max_age_ms: int

    def way(self, created_ms: int, now_ms: int) -> Way:
        if self.mode != "auto":
            return self.mode
        return "broker" if now_ms - created_ms <= self.max_age_ms else "s3"


def broker_order(brokers: Sequence[BrokerMetadata], key: str, writer: str, rack: str) -> list[BrokerMetadata]:
    """The brokers to ask for part `key` (stored by broker `writer`), best first: in `rack` (when
    named and any broker is there) before the others; within each, the writer first, then by
    rendezvous hash of `key`, so that the same part goes to the same broker from every reader."""
    def rank(b: BrokerMetadata) -> tuple[bool, bool, bytes]:
        away = bool(rack) and b.rack != rack
        return away, b.id != writer, hashlib.blake2b(f"{b.id}/{key}".encode(), digest_size=8).digest()
    return sorted(brokers, key=rank)

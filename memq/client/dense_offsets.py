"""Dense offsets for readers outside a broker (memq's Consumer, the Spark driver).

A dense topic's record offset is its notification's base plus its index (`memq.kafka_api.dense`). A
reader that follows the notifications knows their record counts, so it needs one base to count
from: it asks a broker (`GET /v1/offsets`, `memq.broker.doors.offsets`) for a checkpoint where it
starts or moves, then counts forward over the notifications it reads with the same
`PartitionBases` and `DenseScheme` the broker uses (DECISIONS: "Dense offsets for memq's Consumer
and Spark"). Blocking; one instance per topic and reader.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memq.errors import AuthorizationError, BrokerUnavailableError, OffsetUnknownError, UnknownTopicError
from memq.kafka_api.dense import Checkpoint, DenseScheme, PartitionBases

from ._auth import NO_AUTH, BrokerAuth
from .cluster import ResolvedTopic, broker_urls

OFFSETS_PATH = "/v1/offsets"   # memq.broker.doors.offsets
#: Notifications' bases a reader keeps per partition behind the newest it counted (8 bytes each):
#: older ones (a position far behind, rare) are asked of a broker again.
KEPT_BEHIND = 1 << 16


@dataclass(frozen=True)
class BrokerOffsets:
    """Asks brokers (`urls`, in order, the first that answers) for a partition's checkpoints."""

    urls: Sequence[str]
    auth: BrokerAuth = NO_AUTH
    timeout_s: float = 10.0

    def checkpoint(self, topic: str, partition: int, *, note: int | None = None,
                   offset: int | None = None) -> Checkpoint:
        """Where notification `note` starts, or the notification holding record `offset` (past the
        end: the next one). OffsetUnknownError when the broker cannot tell (`note` past the end,
        no checkpoint in the retained notifications); BrokerUnavailableError when none answers."""
        if not self.urls:
            raise BrokerUnavailableError(f"topic {topic} has dense offsets: a broker tells a reader where they "
                                         f"stand, and none is configured (producer.brokers, or Spark's memq.broker)")
        asked = {"topic": topic, "partition": partition, **({"note": note} if note is not None else {"offset": offset})}
        last: Exception | None = None
        for url in self.urls:
            request = urllib.request.Request(f"{url.rstrip('/')}{OFFSETS_PATH}?{urllib.parse.urlencode(asked)}",
                                             headers=self.auth.headers())
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s, context=self.auth.ssl_context) as resp:
                    answer = json.loads(resp.read())
                return Checkpoint(int(answer["note"]), int(answer["base"]))
            except urllib.error.HTTPError as e:
                why = _reason(e)
                if e.code == 409:
                    raise OffsetUnknownError(f"topic {topic}[{partition}] {asked}: {why}") from None
                if e.code == 403:
                    raise AuthorizationError(why) from None
                last = UnknownTopicError(why) if e.code == 404 else BrokerUnavailableError(f"broker {url}: {why}")
            except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
                last = self.auth.failure(url, e)
            except (ValueError, KeyError, TypeError) as e:
                last = BrokerUnavailableError(f"broker {url}: {OFFSETS_PATH} answered {e}")
        assert last is not None
        raise last


def _reason(e: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(e.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return f"HTTP {e.code}"


class CountedOffsets:
    """One dense topic's record offsets as a reader counts them, per partition: from a broker's
    checkpoint, forward over the notifications the reader reads (`count`)."""

    def __init__(self, topic: str, brokers: BrokerOffsets) -> None:
        self.topic = topic
        self._brokers = brokers
        self._schemes: dict[int, DenseScheme] = {}

    def count(self, partition: int, notes: Iterable[tuple[int, int]]) -> None:
        """Count (notification offset, record count) pairs read in order from `partition`: a
        run that does not follow what was counted (a seek, a rebalance) starts from a checkpoint."""
        notes = list(notes)
        if not notes:
            return
        first = notes[0][0]
        scheme = self._schemes.get(partition)
        if scheme is None or not scheme.bases.first <= first <= scheme.bases.next:
            scheme = self._schemes[partition] = DenseScheme(
                PartitionBases(self._brokers.checkpoint(self.topic, partition, note=first)))
        scheme.bases.add(notes)
        scheme.bases.forget_before(scheme.bases.next - KEPT_BEHIND)

    def offset_of(self, partition: int, note: int, index: int = 0) -> int:
        """The offset of record `index` of notification `note` (its base when 0)."""
        scheme = self._schemes.get(partition)
        if scheme is not None:
            try:
                return scheme.offset_of(note, index)
            except OffsetUnknownError:
                pass
        return self._brokers.checkpoint(self.topic, partition, note=note).base + index

    def position_of(self, partition: int, offset: int) -> tuple[int, int]:
        """(notification, index) of record `offset` (past the end: the next notification)."""
        scheme = self._schemes.get(partition)
        if scheme is not None and scheme.bases.base(scheme.bases.first) <= offset < scheme.bases.base(scheme.bases.next):
            return scheme.position_of(offset)
        at = self._brokers.checkpoint(self.topic, partition, offset=offset)
        return at.note, offset - at.base

    def scheme(self, partition: int) -> CountedScheme:
        """`partition`'s offsets as the partition log model's `OffsetScheme` (`memq.log.model`)."""
        return CountedScheme(self, partition)

    def forget(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._schemes.pop(p, None)


@dataclass(frozen=True, slots=True)
class CountedScheme:
    """One partition of `CountedOffsets` as an `OffsetScheme`: a compacted prefix is entered by
    record offset and its survivors placed in notifications through it, as a broker's Fetch does."""

    offsets: CountedOffsets
    partition: int

    def offset_of(self, note: int, index: int) -> int:
        return self.offsets.offset_of(self.partition, note, index)

    def position_of(self, offset: int) -> tuple[int, int]:
        return self.offsets.position_of(self.partition, offset)

    def start_of(self, note: int) -> int:
        return self.offsets.offset_of(self.partition, note)

    def end_of(self, note: int, count: int) -> int:
        return self.offsets.offset_of(self.partition, note, max(count, 0))


def topic_offsets(resolved: ResolvedTopic, timeout_s: float) -> CountedOffsets | None:
    """A dense topic's offsets as a reader counts them, asking the metadata's brokers (else the
    configured ones); None on a sparse topic (its offsets are positions: nothing to count)."""
    if resolved.topic.offsets != "dense":
        return None
    urls = [b.url for b in resolved.brokers if b.url] or broker_urls(resolved.config.producer.brokers)
    return CountedOffsets(resolved.topic.name,
                          BrokerOffsets(tuple(urls), BrokerAuth.of(resolved.config.producer), timeout_s))

"""A dense topic's record offsets on the driver (`TopicConfig.offsets = dense`).

There `startingOffsets`/`endingOffsets`, a stream's offsets and the `offset` column are record
numbers, the ones Kafka clients read. The driver maps a range of record offsets to the notifications
holding it, and each part read to its base, with memq's one reader-side count
(`memq.client.dense_offsets`: a broker's checkpoint, counted forward over the notifications the
driver reads anyway); executors get each part's base and the span its rows are cut to in the
`BatchRef`, so they ask nothing. A compacted prefix is entered by record offset (the partition
log's segments, as a broker's Fetch enters it): its parts keep their survivors' record offsets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from memq.client._auth import BrokerAuth
from memq.client.dense_offsets import BrokerOffsets, CountedOffsets
from memq.compaction.manifest import Manifest
from memq.log.model import PartitionLog
from spark_source.compacted import earliest, prefix_refs, read_ranges
from spark_source.options import SourceOptions
from spark_source.plan import OPEN_END, BatchRef, NotificationLog


def driver_offsets(opts: SourceOptions) -> CountedOffsets | None:
    """The topic's counted offsets (None: sparse, offsets are notification offsets)."""
    if not opts.dense:
        return None
    return CountedOffsets(opts.topic, BrokerOffsets(opts.brokers, BrokerAuth.of(opts.config.producer),
                                                    opts.config.kafka.request_timeout_ms / 1000))


def record_offsets(offsets: CountedOffsets | None, notes: Mapping[int, int]) -> dict[int, int]:
    """Each partition's position at a notification as the source's offsets: the notification
    offset on a sparse topic, the offset of its first record on a dense one."""
    return dict(notes) if offsets is None else {p: offsets.offset_of(p, n) for p, n in notes.items()}


def first_offsets(offsets: CountedOffsets | None, lows: Mapping[int, int],
                  manifests: Mapping[int, Manifest]) -> dict[int, int]:
    """Where each partition's log starts in the source's offsets: the model's `start_note` on a
    sparse topic; on a dense one its `log_start` (a compacted prefix's first survivor, which needs
    none of the prefix's notifications counted)."""
    if offsets is None:
        return earliest(lows, manifests)
    return {p: PartitionLog(manifests.get(p), low=low, scheme=offsets.scheme(p)).log_start for p, low in lows.items()}


def dense_ranges(nlog: NotificationLog, offsets: CountedOffsets, spans: Mapping[int, tuple[int, int | None]],
                 lows: Mapping[int, int], manifests: Mapping[int, Manifest], *,
                 exact: bool = False) -> dict[int, list[BatchRef]]:
    """The batches holding records [start, stop) of each partition (stop None: its end): below a
    compacted prefix's tail offset its parts, entered by offset (the partition log's segments, as
    a broker's Fetch reads them), then the plain parts, each with its base and the span its rows
    are cut to (`compacted.read_ranges` over the notifications)."""
    prefix: dict[int, list[BatchRef]] = {}
    notes: dict[int, tuple[int, int | None]] = {}
    for p, (start, stop) in spans.items():
        plog = PartitionLog(manifests.get(p), low=lows[p], scheme=offsets.scheme(p))
        if plog.in_prefix(start):
            segments = plog.segments(start)
            prefix[p] = prefix_refs(segments, p, start, stop, dense=True)
            assert segments.tail is not None and plog.manifest is not None
            if stop is not None and stop <= plog.manifest.tail_offset:
                continue
            first = segments.tail.note
        else:
            first = offsets.position_of(p, start)[0]
        if stop is None:
            notes[p] = (first, None)
        else:
            last, index = offsets.position_of(p, stop)
            notes[p] = (first, last + (index > 0))   # a stop inside a part reads that part, cut
    groups = read_ranges(nlog, notes, lows, {}, exact=exact)
    out: dict[int, list[BatchRef]] = {}
    for p, (start, stop) in spans.items():
        refs = groups.get(p, [])
        offsets.count(p, ((r.offset, r.records) for r in refs if r.offset is not None))
        span = (start, OPEN_END if stop is None else stop)
        out[p] = prefix.get(p, []) + [dataclasses.replace(r, base=offsets.offset_of(p, r.offset), span=span)
                                      for r in refs if r.offset is not None]
    return out

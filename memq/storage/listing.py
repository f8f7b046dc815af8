"""The handler-independent half of `list_topic`: fan out over the 256 prefixes, merge, sort.

A retried PUT can leave objects of earlier attempts behind (an attempt that timed out but
landed). Every attempt of one batch has the same prefix, time, broker and unique part, and
an attempt is only made after the previous one failed, so the highest attempt that exists
is the one a notification names (or, if the put failed for good, a batch the producers
resend). Listing returns that one only, so readers of a listing do not see a batch twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from memq.storage.base import ObjectInfo
from memq.storage.naming import PREFIXES, parse_key


async def list_all_prefixes(list_prefix: Callable[[str], Awaitable[list[ObjectInfo]]],
                            concurrency: int, *, all_attempts: bool = False) -> list[ObjectInfo]:
    """`list_prefix` for every prefix, at most `concurrency` at once; by time.

    Latest attempts only, unless `all_attempts` (then every object listed).
    """
    slots = asyncio.Semaphore(concurrency)  # per call, so no tie to one event loop

    async def bounded(prefix: str) -> list[ObjectInfo]:
        async with slots:
            return await list_prefix(prefix)

    tasks = [asyncio.ensure_future(bounded(p)) for p in PREFIXES]
    try:
        parts = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()  # one prefix failed for good: stop listing the rest
        raise
    if all_attempts:
        return sorted((i for part in parts for i in part), key=lambda i: (i.timestamp_ms, i.location.key))
    latest: dict[tuple[str, int, str, str], tuple[int, ObjectInfo]] = {}
    for part in parts:
        for info in part:
            k = parse_key(info.location.key)
            batch = (k.prefix, k.timestamp_ms, k.broker_id, k.unique)
            if batch not in latest or k.attempt > latest[batch][0]:
                latest[batch] = (k.attempt, info)
    return sorted((info for _, info in latest.values()), key=lambda i: (i.timestamp_ms, i.location.key))

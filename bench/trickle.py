"""A trickle topic (1 message/s) with and without the latency budget: objects per day, and the price.

Two topics on one broker, fed at the same time at 1 msg/s (100-byte values, ack=all, no flush):
- `default`: batch_ms 250 and no budget, today's behaviour: every message opens a batch that
  seals 250 ms later, so one object, one PUT and one notification per message;
- `budget`: the same batch_ms with min_batch_bytes 1 MiB and max_batch_ms 10 s: a small batch
  keeps filling, so about one object per 10 s.
Objects come from the broker's counters; objects per day = objects / run time x 86,400. The
ratio is default over budget objects per day (higher: the budget saves more); the send -> ack
p99 of each topic is the latency paid for it, and the S3 request cost per month of each is
priced with `memq cost`'s model at its default prices.
"""

from __future__ import annotations

import asyncio
import functools
import time

from bench._cluster import bench_cluster, broker_samples
from memq.client.producer import Delivery, Producer
from memq.config import CostConfig, ProducerConfig, TopicConfig
from memq.cost import TopicCounters, Usage, estimate

MiB = 1024 ** 2
BATCH_MS = 250
MAX_BATCH_MS = 10_000
DAY_S = 86_400


async def _feed(url: str, topics: list[str], seconds: float) -> dict[str, list[float]]:
    """One 100-byte value per second to each topic; send -> ack seconds per topic."""
    latencies: dict[str, list[float]] = {t: [] for t in topics}
    async with Producer(ProducerConfig(brokers=url, ack="all", linger_ms=5)) as producer:
        pending: list[asyncio.Future[Delivery]] = []

        def on_ack(topic: str, sent: float, fut: asyncio.Future[Delivery]) -> None:
            latencies[topic].append(time.perf_counter() - sent)

        t0 = time.perf_counter()
        i = 0
        while time.perf_counter() - t0 < seconds:
            for topic in topics:
                sent = time.perf_counter()
                fut = await producer.send(topic, b"%099d" % i)
                fut.add_done_callback(functools.partial(on_ack, topic, sent))
                pending.append(fut)
            i += 1
            await asyncio.sleep(max(0.0, t0 + i - time.perf_counter()))
        await asyncio.gather(*pending)
    return latencies


def _objects(url: str, topic: str) -> int:
    return int(sum(s.value for s in broker_samples(url, "memq_broker_batch_bytes")
                   if s.name == "memq_broker_batch_bytes_count" and s.labels.get("topic") == topic))


def _put_usd_month(objects_per_s: float) -> float:
    """The S3 request cost per month (PUTs, consumer GETs) of a topic writing `objects_per_s`."""
    r = TopicCounters(objects=objects_per_s, requests={"put": objects_per_s, "get": 0.0, "list": 0.0, "delete": 0.0})
    return estimate(Usage("t", 1.0, r, r), 0.0, CostConfig()).memq.requests_usd


def run(quick: bool) -> dict:
    seconds = 30.0 if quick else 120.0
    # objects of their own (storage_group ""): in one storage group the default topic's seals
    # would take the budget topic's batches along, and the budget would not show
    topics = (TopicConfig("trickle-default", batch_ms=BATCH_MS, storage_group=""),
              TopicConfig("trickle-budget", batch_ms=BATCH_MS, min_batch_bytes=MiB, max_batch_ms=MAX_BATCH_MS,
                          storage_group=""))
    with bench_cluster(topics) as bc:
        url = bc.broker.url
        t0 = time.perf_counter()
        latencies = asyncio.run(_feed(url, [t.name for t in topics], seconds))
        elapsed = time.perf_counter() - t0
        objects = {t.name: _objects(url, t.name) for t in topics}
    out: dict[str, dict[str, float]] = {}
    for t in topics:
        lat = sorted(latencies[t.name])
        per_day = objects[t.name] / elapsed * DAY_S
        out[t.name] = {"objects": objects[t.name], "messages": len(lat), "objects_per_day": round(per_day),
                       "ack_p50_s": round(lat[len(lat) // 2], 3), "ack_p99_s": round(lat[int(0.99 * (len(lat) - 1))], 3),
                       "requests_usd_month": round(_put_usd_month(objects[t.name] / elapsed), 2)}
        print(f"{t.name}: {objects[t.name]} objects for {len(lat)} messages in {elapsed:.0f} s = "
              f"{per_day:,.0f} objects/day, send->ack p99 {out[t.name]['ack_p99_s']} s, "
              f"S3 requests {out[t.name]['requests_usd_month']} USD/month", flush=True)
    before, after = out["trickle-default"], out["trickle-budget"]
    return {"ratios": {"objects_per_day_default_vs_budget": round(before["objects_per_day"] / after["objects_per_day"], 1)},
            **out, "seconds": round(elapsed, 1), "batch_ms": BATCH_MS, "min_batch_bytes": MiB, "max_batch_ms": MAX_BATCH_MS}

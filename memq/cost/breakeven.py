"""Break-even: the ingest rate above which a topic costs less on memq than on Kafka, and which
change of its settings would make it cost less at the rate it has now. Pure: no I/O.

The rate model prices a topic at a steady ingest rate B (bytes/s) with `model.estimate` itself,
on counters it derives from the topic's settings and what was measured on it:
- B is spread evenly over the `brokers` its bytes reach; on each, x = B / brokers;
- each broker seals r(x) batches a second: at `batch_bytes`, at `batch_ms` of age, or, under
  `min_batch_bytes`, at `max_batch_ms`, and never more than one per producer Message:
  r(x) = min(x / message_bytes, max(x / batch_bytes, min(1 / batch_ms, max(1 / max_batch_ms, x / min_batch_bytes))));
  one notification per batch;
- PUTs: one per batch for a topic with objects of its own; in a storage group the object holds
  the current batch of each topic of the group on that broker, so the group writes
  G(x) = max(r(x), g) objects a second (g: what the group's other topics seal there) and the topic
  pays its share by bytes, x / (x + X) (X: their bytes there), as `memq cost` splits them;
- per batch, as measured on the topic: notification bytes, the brokers' GETs; per PUT its
  DELETEs; stored bytes per byte in; its LIST requests a second as they are (a fixed cost).
  Not modelled: producers' flushes (each seals a batch early), `batch_messages`, retries.

Every line of `estimate` is linear in those counters, so memq's monthly cost is
f + a B + c_p P(B) + c_u U(B) (P: batches a second, U: the PUTs the topic pays), Kafka's is
k0 + k B, and r, G are piecewise linear in x with breakpoints known from the settings. On each
piece the difference times (x + X) is a quadratic in x: the break-even is its largest root after
which memq stays the cheaper, in closed form (no search). It is None when memq is dearer at
every rate (its cost per byte above Kafka's with these prices), 0 when it is cheaper at any.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.config import CostConfig

from .counters import REQUEST_CLASSES, Compacted, Seal, TopicCounters, Usage
from .model import Estimate, estimate, kafka_lines

MiB = 2 ** 20
#: the fewest brokers placement gives a topic (a second one on another rack: failover)
MIN_BROKERS = 2
#: how far `batch_ms` may go for a topic with no latency budget of its own (`max_batch_ms`):
#: the guide's example budget, well under producers' 30 s request timeout (ack=all waits for it)
DEFAULT_BUDGET_MS = 10_000
#: a notification's bytes when none was measured (a batch's pointer: topic, bucket, key, counts)
NOTIFICATION_BYTES = 300.0


@dataclass(frozen=True)
class Peers:
    """A storage group's other topics on the brokers a topic writes to, per broker (averaged over
    them): their bytes a second and the batches a second they seal."""

    bytes_per_s: float = 0.0
    batches_per_s: float = 0.0


@dataclass(frozen=True)
class Shape:
    """What the rate model knows of a topic: where its bytes go, how it seals, what each batch
    costs besides its PUT (as measured), and its storage group's other topics."""

    topic: str
    brokers: int
    seal: Seal
    message_bytes: float = 0.0            # bytes per producer Message (0: unknown, no cap on batches)
    stored_per_byte: float = 1.0
    notification_bytes: float = NOTIFICATION_BYTES
    gets_per_batch: float = 0.0
    deletes_per_put: float = 0.0
    lists_per_s: float = 0.0
    peers: Peers = Peers()
    compacted: Compacted | None = None


def batches_per_s(seal: Seal, x: float, message_bytes: float = 0.0) -> float:
    """Batches a broker seals a second at `x` bytes/s of steady traffic (r(x) above)."""
    if x <= 0:
        return 0.0
    held = 1000 / seal.max_batch_ms
    if seal.min_batch_bytes > 0:
        held = max(held, x / seal.min_batch_bytes)
    r = max(x / seal.batch_bytes, min(1000 / seal.batch_ms, held))
    return min(r, x / message_bytes) if message_bytes > 0 else r


def _objects(shape: Shape, x: float) -> float:
    """The objects a second one broker writes for the topic's group (G(x)); its own with no peers."""
    mine = batches_per_s(shape.seal, x, shape.message_bytes)
    return max(mine, shape.peers.batches_per_s) if shape.peers.bytes_per_s > 0 else mine


def _share(shape: Shape, x: float) -> float:
    return x / (x + shape.peers.bytes_per_s) if x > 0 else 0.0


def _counters(shape: Shape, bytes_per_s: float, batches: float, puts: float) -> TopicCounters:
    """The topic's rates with `bytes_per_s` in, `batches` a second and `puts` PUTs a second paid."""
    requests = dict.fromkeys(REQUEST_CLASSES, 0.0)
    requests.update(put=puts, get=batches * shape.gets_per_batch, delete=puts * shape.deletes_per_put,
                    list=shape.lists_per_s)
    return TopicCounters(bytes_in=bytes_per_s, objects=batches, stored_bytes=bytes_per_s * shape.stored_per_byte,
                         notifications=batches, notification_bytes=batches * shape.notification_bytes,
                         requests=requests)


def rates_at(shape: Shape, bytes_per_s: float) -> TopicCounters:
    """The topic's counters a second at a steady `bytes_per_s`, by the rate model."""
    n = shape.brokers
    x = bytes_per_s / n
    return _counters(shape, bytes_per_s, n * batches_per_s(shape.seal, x, shape.message_bytes),
                     n * _objects(shape, x) * _share(shape, x))


def cost_at(shape: Shape, bytes_per_s: float, retention_s: float, p: CostConfig) -> Estimate:
    """The monthly estimate (`model.estimate`) of the topic at a steady `bytes_per_s`."""
    rates = rates_at(shape, bytes_per_s)
    return estimate(Usage(shape.topic, 0.0, rates, rates, shape.compacted), retention_s, p)


@dataclass(frozen=True)
class _Linear:
    """memq - Kafka per month = f + s B + c_p P + c_u U: the model's own coefficients."""

    f: float
    s: float
    c_p: float
    c_u: float


def _linear(shape: Shape, retention_s: float, p: CostConfig) -> _Linear:
    """The coefficients of the cost difference, read off `estimate` and `kafka_lines` at unit rates
    (both are affine in the counters, so this is exact)."""
    def memq(b: float, batches: float, puts: float) -> float:
        rates = _counters(shape, b, batches, puts)
        return estimate(Usage(shape.topic, 0.0, rates, rates, shape.compacted), retention_s, p).memq_usd

    def kafka(b: float) -> float:
        return kafka_lines(b, retention_s, p, kept_bytes=shape.compacted.kept_bytes if shape.compacted else None).usd

    f = memq(0, 0, 0)
    return _Linear(f - kafka(0), (memq(1, 0, 0) - f) - (kafka(1) - kafka(0)), memq(0, 1, 0) - f, memq(0, 0, 1) - f)


def _breakpoints(shape: Shape) -> list[float]:
    """Per-broker rates x where r(x) or G(x) may change slope (a superset)."""
    s = shape.seal
    rates = [1000 / s.batch_ms, 1000 / s.max_batch_ms]
    if shape.peers.bytes_per_s > 0:
        rates.append(shape.peers.batches_per_s)
    sizes = [s.batch_bytes] + [v for v in (s.min_batch_bytes, shape.message_bytes) if v > 0]
    return sorted({size * rate for size in sizes for rate in rates if size * rate > 0})


def _roots(a: float, b: float, c: float) -> list[float]:
    """Real roots of a x^2 + b x + c (a linear or constant one when a or b vanish)."""
    scale = max(abs(a), abs(b), abs(c), 1e-300)
    a, b, c = a / scale, b / scale, c / scale
    if abs(a) < 1e-12:
        return [-c / b] if abs(b) > 1e-12 else []
    disc = b * b - 4 * a * c
    if disc < 0:
        return []
    q = -0.5 * (b + math.copysign(math.sqrt(disc), b))
    return [q / a] + ([c / q] if q != 0 else [])


def break_even(shape: Shape, retention_s: float, p: CostConfig) -> float | None:
    """The ingest rate (bytes/s) above which the topic costs less on memq than on Kafka, with its
    settings: 0 when it does at any rate, None when at none. Closed form (module doc)."""
    n, peers = shape.brokers, shape.peers.bytes_per_s
    lin = _linear(shape, retention_s, p)

    def diff(x: float) -> float:
        return (lin.f + lin.s * n * x + lin.c_p * n * batches_per_s(shape.seal, x, shape.message_bytes)
                + lin.c_u * n * _objects(shape, x) * _share(shape, x))

    cuts = [0.0, *_breakpoints(shape)]
    roots: list[float] = []
    last = (0.0, 0.0, 0.0)
    for lo, hi in zip(cuts, [*cuts[1:], math.inf]):
        # r and G are linear inside (lo, hi): read them at two points inside
        x1, x2 = (lo + (hi - lo) / 3, lo + 2 * (hi - lo) / 3) if hi < math.inf else (2 * lo + 1, 3 * lo + 2)
        r1, r2 = (batches_per_s(shape.seal, x, shape.message_bytes) for x in (x1, x2))
        g1, g2 = _objects(shape, x1), _objects(shape, x2)
        rb, gb = (r2 - r1) / (x2 - x1), (g2 - g1) / (x2 - x1)
        ra, ga = r1 - rb * x1, g1 - gb * x1
        # diff(x) * (x + X) = (L0 + L1 x)(x + X) + c_u n (ga + gb x) x
        l0, l1 = lin.f + lin.c_p * n * ra, lin.s * n + lin.c_p * n * rb
        last = (l1 + lin.c_u * n * gb, l0 + l1 * peers + lin.c_u * n * ga, l0 * peers)
        roots += [x for x in _roots(*last) if lo < x <= hi * (1 + 1e-9)]
    leading = next((c for c in last if abs(c) > 1e-15), 0.0)
    if leading > 0:
        return None                   # dearer however fast it goes
    for x in sorted(roots, reverse=True):
        if diff(x * (1 - 1e-6)) > 0 >= diff(x * (1 + 1e-6)):
            return n * x
    return 0.0


@dataclass(frozen=True)
class Suggestion:
    """One change of a topic's settings and what the topic would cost with it, at its rate now."""

    setting: str          # e.g. "batch_ms=3000", "storage_group=payments", "brokers=2"
    memq_usd: float
    kafka_usd: float
    note: str = ""

    @property
    def cheaper(self) -> bool:
        return self.memq_usd <= self.kafka_usd


@dataclass(frozen=True)
class Verdict:
    """A topic against its break-even: the rate now, the break-even (None: never, 0: any rate),
    the model's monthly figures at the rate now, the settings they follow from (`seal`, on
    `brokers`), and the changes that would cut its cost."""

    now_bps: float
    break_even_bps: float | None
    memq_usd: float
    kafka_usd: float
    seal: Seal
    brokers: int
    suggestions: tuple[Suggestion, ...] = ()

    @property
    def above(self) -> bool:
        """memq is the cheaper at the rate now."""
        return self.break_even_bps is not None and self.now_bps >= self.break_even_bps


def shape_of(u: Usage, used: Mapping[str, Usage], group: str | None = None) -> Shape:
    """The rate model's view of topic `u` from what was measured (`used`: every topic, for its
    storage group's other topics); `group` puts it in another storage group."""
    seal = u.seal or Seal()
    if group is not None:
        seal = dataclasses.replace(seal, group=group)
    c = u.counts
    writers = [b for b, v in u.per_broker.items() if v > 0] or list(u.hosts) or ["?"]
    return Shape(topic=u.topic, brokers=len(writers), seal=seal,
                 message_bytes=c.bytes_in / c.messages if c.messages > 0 else 0.0,
                 stored_per_byte=c.stored_bytes / c.bytes_in if c.bytes_in > 0 else 1.0,
                 notification_bytes=c.notification_bytes / c.notifications if c.notifications > 0 else NOTIFICATION_BYTES,
                 gets_per_batch=c.requests["get"] / c.objects if c.objects > 0 else 0.0,
                 deletes_per_put=c.requests["delete"] / c.requests["put"] if c.requests["put"] > 0 else 0.0,
                 lists_per_s=u.rates.requests["list"], peers=peers_of(u.topic, seal.group, writers, used),
                 compacted=u.compacted)


def peers_of(topic: str, group: str, brokers: list[str], used: Mapping[str, Usage]) -> Peers:
    """What the other topics of storage group `group` write on `brokers`, per broker on average."""
    if not group:
        return Peers()
    total, batches = 0.0, 0.0
    for b in brokers:
        here = [(v.per_broker[b], v) for v in used.values()
                if v.topic != topic and v.seal is not None and v.seal.group == group and v.per_broker.get(b, 0) > 0]
        total += sum(x for x, _ in here)
        batches += max((batches_per_s(v.seal, x, _message_bytes(v)) for x, v in here if v.seal), default=0.0)
    return Peers(total / len(brokers), batches / len(brokers))


def _message_bytes(u: Usage) -> float:
    return u.counts.bytes_in / u.counts.messages if u.counts.messages > 0 else 0.0


def _cheapest(shape: Shape, now: float, retention_s: float, p: CostConfig, lo: float, hi: float,
              change: Any) -> float:
    """The least value in [lo, hi], rounded up to two significant digits, at which the topic changed
    by `change(shape, v)` breaks even at `now`, costs falling as v grows; `hi` when none does. Bisection."""
    def dearer(v: float) -> bool:
        e = cost_at(change(shape, v), now, retention_s, p)
        return e.memq_usd > e.kafka_usd

    top = hi
    if not dearer(lo):
        return lo
    if dearer(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if dearer(mid) else (lo, mid)
    unit = 10.0 ** max(0, math.floor(math.log10(hi)) - 1)
    return min(math.ceil(hi / unit) * unit, top)


def suggest(u: Usage, used: Mapping[str, Usage], retention_s: float, p: CostConfig) -> tuple[Suggestion, ...]:
    """The changes that would cut topic `u`'s monthly cost at its rate now, each priced by the rate
    model: a longer `batch_ms` (the least that breaks even, within its latency budget), a storage
    group whose topics share its brokers (the cheapest), fewer brokers (down to `MIN_BROKERS`).
    Only those that cost less than it does now are named."""
    shape, now = shape_of(u, used), u.rates.bytes_in
    base = cost_at(shape, now, retention_s, p).memq_usd
    seal = shape.seal
    out: list[Suggestion] = []
    budget = max(seal.max_batch_ms if seal.min_batch_bytes > 0 else DEFAULT_BUDGET_MS, seal.batch_ms)
    if budget > seal.batch_ms:
        def longer(s: Shape, ms: float) -> Shape:
            return dataclasses.replace(s, seal=dataclasses.replace(s.seal, batch_ms=ms,
                                                                    max_batch_ms=max(s.seal.max_batch_ms, ms)))
        ms = _cheapest(shape, now, retention_s, p, seal.batch_ms, budget, longer)
        limit = (f"within its latency budget, max_batch_ms {budget:.0f}" if seal.min_batch_bytes > 0 else
                 f"it sets no latency budget: {DEFAULT_BUDGET_MS} ms at most")
        out.append(_suggestion(f"batch_ms={ms:.0f}", cost_at(longer(shape, ms), now, retention_s, p),
                               f"each record waits up to {ms / 1000:g} s at the broker ({limit})"))
    groups = {v.seal.group for v in used.values() if v.seal is not None and v.seal.group and v.topic != u.topic}
    joined = [(g, shape_of(u, used, g)) for g in sorted(groups - {seal.group})]
    priced = [(g, s, cost_at(s, now, retention_s, p)) for g, s in joined if s.peers.bytes_per_s > 0]
    if priced:
        g, s, e = min(priced, key=lambda t: t[2].memq_usd)
        pace = (", which would then seal at this topic's pace: their share of the PUTs grows"
                if batches_per_s(s.seal, now / s.brokers, s.message_bytes) > s.peers.batches_per_s else "")
        out.append(_suggestion(f"storage_group={g}", e, f"its objects shared with the group's other topics "
                                                        f"({s.peers.bytes_per_s / MiB:,.3f} MiB/s per broker){pace}"))
    if shape.brokers > MIN_BROKERS:
        def fewer(s: Shape, k: float) -> Shape:
            return dataclasses.replace(s, brokers=shape.brokers - int(k))
        k = _cheapest(shape, now, retention_s, p, 1, shape.brokers - MIN_BROKERS, fewer)
        out.append(_suggestion(f"brokers={shape.brokers - int(k)}", cost_at(fewer(shape, k), now, retention_s, p),
                               f"on {shape.brokers - int(k)} of its {shape.brokers} brokers (a lower expected_mbps)"))
    return tuple(s for s in out if s.memq_usd < base - 0.005)


def _suggestion(setting: str, e: Estimate, note: str) -> Suggestion:
    return Suggestion(setting, e.memq_usd, e.kafka_usd, note)


def verdict(u: Usage, used: Mapping[str, Usage], retention_s: float, p: CostConfig,
            measured: Estimate | None = None) -> Verdict:
    """Topic `u` against its break-even; suggestions when it is below it (or its measured bill,
    `measured`, is the dearer)."""
    shape = shape_of(u, used)
    now = u.rates.bytes_in
    at = cost_at(shape, now, retention_s, p)
    v = Verdict(now, break_even(shape, retention_s, p), at.memq_usd, at.kafka_usd, shape.seal, shape.brokers)
    if not v.above or (measured is not None and measured.memq_usd > measured.kafka_usd):
        v = dataclasses.replace(v, suggestions=suggest(u, used, retention_s, p))
    return v


def as_dict(v: Verdict) -> dict[str, Any]:
    """A verdict as `memq cost --json` and the dashboard show it (rates in MiB/s)."""
    be = v.break_even_bps
    return {"now_mib_s": v.now_bps / MiB, "break_even_mib_s": None if be is None else be / MiB,
            "above": v.above, "method": "closed form", "memq_usd_month": v.memq_usd, "kafka_usd_month": v.kafka_usd,
            "settings": {**dataclasses.asdict(v.seal), "brokers": v.brokers},
            "suggestions": [{"setting": s.setting, "memq_usd_month": s.memq_usd, "kafka_usd_month": s.kafka_usd,
                             "cheaper": s.cheaper, "note": s.note} for s in v.suggestions]}


def mib_s(bytes_per_s: float) -> str:
    """A rate in MiB/s to three significant digits, never in exponent form: 0.403, 0.0043, 12300."""
    return format(float(f"{bytes_per_s / MiB:.3g}"), "f").rstrip("0").rstrip(".") or "0"


def describe(v: Verdict) -> list[str]:
    """The verdict in words, one line each (`memq cost`)."""
    be = v.break_even_bps
    now = f"now {mib_s(v.now_bps)} MiB/s"
    if be is None:
        lines = [f"break-even: none: with these settings and prices memq is dearer at any rate ({now})"]
    elif be == 0:
        lines = [f"break-even: 0 MiB/s: with these settings memq is the cheaper at any rate ({now})"]
    else:
        lines = [f"break-even: {mib_s(be)} MiB/s ({now}, {v.now_bps / be:.0%} of it): "
                 f"memq is the cheaper {'now' if v.above else 'above it'}"]
    s = v.seal
    budget = f", min_batch_bytes {s.min_batch_bytes:,.0f} until {s.max_batch_ms:,.0f} ms" if s.min_batch_bytes else ""
    group = f"storage group {s.group}" if s.group else "objects of its own"
    lines.append(f"  with batch_ms {s.batch_ms:,.0f}{budget}, batch_bytes {s.batch_bytes:,.0f}, {group}, on {v.brokers} "
                 f"broker(s): steady at the rate now, memq {v.memq_usd:,.2f} vs Kafka {v.kafka_usd:,.2f} USD/month")
    if v.suggestions:
        lines.append("  to cost less at the rate now:")
    for idea in v.suggestions:
        lines.append(f"    {idea.setting}: memq {idea.memq_usd:,.2f} USD/month ({'cheaper' if idea.cheaper else 'still dearer'} "
                     f"than Kafka's {idea.kafka_usd:,.2f}); {idea.note}")
    return lines

"""A broker's cost-relevant counters, read from its Prometheus text, per topic. Pure: no I/O.

What S3 bills is a request (each try, failed ones included: `memq_storage_attempts`), so the
storage operations map onto S3's request classes: put -> PUT, list -> LIST, delete and bulk
deletes -> DELETE, anything else (get, get_range) -> GET, as S3 bills it. Only brokers are
scraped: consumers' GETs are modelled by `memq.cost.model`, not counted here.

A storage group's shared objects serve several topics with one request: requests labelled
`group:<g>` are split over the group's topics by the bytes each put into the group's objects on
that broker since it started (`memq_broker_group_bytes`); with no such bytes they are dropped,
like requests that name no topic.

A compacted topic's storage is no rate: each partition's compactor (a broker) reports, per partition, the
bytes of its compacted parts and its dirty ratio (the share of the partition's bytes not
compacted yet), gauges read as they stand (`Compacted`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from memq.errors import InvalidInputError
from memq.storage.metrics import GROUP_LABEL

REQUEST_CLASSES = ("put", "get", "list", "delete")


def request_class(op: str) -> str:
    """The S3 request class of a storage operation name: put, list, delete (bulk deletes too), or
    get, which S3 bills for "GET, SELECT and all other requests" (get_range, head, ...)."""
    return next((cls for cls in ("put", "list", "delete") if cls in op), "get")


@dataclass(frozen=True)
class TopicCounters:
    """Counts (or, scaled, rates) of one topic. `stored_bytes` is bytes of batch objects written."""

    bytes_in: float = 0.0
    messages: float = 0.0           # producers' Messages (their upload units), to model a trickle's batches
    objects: float = 0.0
    stored_bytes: float = 0.0
    notifications: float = 0.0
    notification_bytes: float = 0.0
    requests: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REQUEST_CLASSES, 0.0))

    def __add__(self, other: TopicCounters) -> TopicCounters:
        return self._combine(other, 1.0)

    def __sub__(self, other: TopicCounters) -> TopicCounters:
        return self._combine(other, -1.0)

    def _combine(self, other: TopicCounters, sign: float) -> TopicCounters:
        scalars = {f.name: getattr(self, f.name) + sign * getattr(other, f.name)
                   for f in dataclasses.fields(self) if f.name != "requests"}
        return TopicCounters(**scalars, requests={c: self.requests[c] + sign * other.requests[c]
                                                  for c in REQUEST_CLASSES})

    def scaled(self, factor: float) -> TopicCounters:
        scalars = {f.name: getattr(self, f.name) * factor for f in dataclasses.fields(self) if f.name != "requests"}
        return TopicCounters(**scalars, requests={c: v * factor for c, v in self.requests.items()})


@dataclass(frozen=True)
class Compacted:
    """What a compacted topic keeps in the store now, summed over its partitions: its compacted
    parts and its plain tail (the bytes written since its last compaction)."""

    parts_bytes: float
    tail_bytes: float

    @property
    def kept_bytes(self) -> float:
        return self.parts_bytes + self.tail_bytes


def compacted_of(parts_bytes: dict[str, float], dirty_ratio: dict[str, float]) -> Compacted | None:
    """A topic's kept bytes from its partitions' gauges (partition -> value): each partition's tail
    is parts x ratio / (1 - ratio), since ratio = tail / (parts + tail). None until compacted:
    while a partition with data never was (ratio 1: its tail is unknown and nothing is saved yet)."""
    ratios = [dirty_ratio.get(p, 0.0) for p in parts_bytes]
    if not any(parts_bytes.values()) or any(r >= 1.0 for r in ratios):
        return None
    return Compacted(sum(parts_bytes.values()),
                     sum(parts * r / (1.0 - r) for parts, r in zip(parts_bytes.values(), ratios)))


@dataclass(frozen=True)
class Seal:
    """How a broker seals a topic's batches, as it reports them (`memq_broker_topic_settings`, one
    line per topic with its settings as labels): at
    `batch_bytes`, or at `batch_ms` of age, or, under `min_batch_bytes`, at `max_batch_ms`; and the
    storage group its batches are stored in ("": objects of its own)."""

    batch_bytes: float = 8 * 2 ** 20
    batch_ms: float = 250.0
    min_batch_bytes: float = 0.0
    max_batch_ms: float = 250.0
    group: str = ""


def seal_of(labels: dict[str, str]) -> Seal:
    """A topic's Seal from the labels of its `memq_broker_topic_settings` line (a label missing or
    not a number: the default)."""
    values: dict[str, float] = {}
    for name in ("batch_bytes", "batch_ms", "min_batch_bytes", "max_batch_ms"):
        try:
            values[name] = float(labels[name])
        except (KeyError, ValueError):
            pass
    return Seal(**values, group=labels.get("storage_group", ""))


#: A compacted partition's gauges as its compactor reports them: (stored bytes of its parts, dirty ratio).
PartitionGauges = tuple[float, float]


@dataclass(frozen=True)
class Snapshot:
    """One broker's counters at `taken_s`; `started_s`: when they started counting (Unix times).
    `compaction`: topic -> partition -> gauges, for the compacted partitions this broker compacts."""

    broker: str
    taken_s: float
    started_s: float
    topics: dict[str, TopicCounters]
    compaction: dict[str, dict[str, PartitionGauges]] = field(default_factory=dict)
    settings: dict[str, Seal] = field(default_factory=dict)     # the topics it hosts, and how it seals them


_SCALARS = {"memq_broker_message_bytes_total": "bytes_in",
            "memq_broker_messages_total": "messages",
            "memq_broker_batch_bytes_count": "objects",
            "memq_broker_batch_bytes_sum": "stored_bytes",
            "memq_broker_notification_bytes_total": "notification_bytes"}


def split_groups(requests: dict[str, dict[str, float]],
                 group_bytes: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per topic requests, with each `group:<g>` entry of `requests` shared out over the group's
    topics in proportion to `group_bytes[g]` (topic -> bytes); a group without bytes is dropped."""
    out = {t: dict(per) for t, per in requests.items() if not t.startswith(GROUP_LABEL)}
    for label, per in requests.items():
        if not label.startswith(GROUP_LABEL):
            continue
        shares = group_bytes.get(label[len(GROUP_LABEL):], {})
        total = sum(shares.values())
        for topic, nbytes in shares.items():
            if total > 0:
                mine = out.setdefault(topic, dict.fromkeys(REQUEST_CLASSES, 0.0))
                for cls, n in per.items():
                    mine[cls] += n * nbytes / total
    return out


def parse_metrics(broker: str, text: str, taken_s: float) -> Snapshot:
    """The cost counters in a broker's /metrics text. Requests that name no topic are dropped;
    a storage group's are split over its topics (`split_groups`)."""
    started = 0.0
    values: dict[str, dict[str, float]] = {}
    requests: dict[str, dict[str, float]] = {}
    group_bytes: dict[str, dict[str, float]] = {}
    parts: dict[str, dict[str, float]] = {}
    ratios: dict[str, dict[str, float]] = {}
    seals: dict[str, Seal] = {}

    def add(topic: str, name: str, v: float) -> None:
        values.setdefault(topic, {}).setdefault(name, 0.0)
        values[topic][name] += v

    for family in text_string_to_metric_families(text):
        for s in family.samples:
            topic = s.labels.get("topic", "")
            if s.name == "memq_broker_start_time_seconds":
                started = s.value
            elif s.name in _SCALARS and topic:
                add(topic, _SCALARS[s.name], s.value)
            elif s.name == "memq_broker_batches_total" and topic and s.labels.get("result") == "ok":
                add(topic, "notifications", s.value)
            elif s.name == "memq_storage_attempts_total" and topic:
                per = requests.setdefault(topic, dict.fromkeys(REQUEST_CLASSES, 0.0))
                per[request_class(s.labels["op"])] += s.value
            elif s.name == "memq_broker_group_bytes_total" and topic:
                group_bytes.setdefault(s.labels["group"], {})[topic] = s.value
            elif s.name == "memq_compaction_stored_bytes" and topic:
                parts.setdefault(topic, {})[s.labels["partition"]] = s.value
            elif s.name == "memq_compaction_dirty_ratio" and topic:
                ratios.setdefault(topic, {})[s.labels["partition"]] = s.value
            elif s.name == "memq_broker_topic_settings" and topic and s.value:
                seals[topic] = seal_of(s.labels)
    if not started:
        raise InvalidInputError(f"broker {broker}: /metrics has no memq_broker_start_time_seconds "
                                "(a memq broker older than `memq cost`?)")
    requests = split_groups(requests, group_bytes)
    topics = {t: TopicCounters(**values.get(t, {}), requests=requests.get(t, dict.fromkeys(REQUEST_CLASSES, 0.0)))
              for t in sorted(set(values) | set(requests))}
    compaction = {t: {p: (v, ratios.get(t, {}).get(p, 0.0)) for p, v in per.items()} for t, per in sorted(parts.items())}
    return Snapshot(broker, taken_s, started, topics, compaction, dict(sorted(seals.items())))


@dataclass(frozen=True)
class Usage:
    """What one topic did across the cluster: counts in the window, and rates per second; what it
    keeps now if it is a compacted topic (None: priced as a plain topic); its bytes in per second
    on each broker (`per_broker`), and how the brokers hosting it seal its batches (`seal`, None
    from brokers that do not report it; `hosts`: the brokers that do)."""

    topic: str
    window_s: float
    counts: TopicCounters
    rates: TopicCounters
    compacted: Compacted | None = None
    per_broker: dict[str, float] = field(default_factory=dict)
    seal: Seal | None = None
    hosts: tuple[str, ...] = ()


def usage(after: Iterable[Snapshot], before: Iterable[Snapshot] = ()) -> dict[str, Usage]:
    """Per topic: `after` minus `before` (same broker and start, else since its start), summed over brokers.

    Each broker's rate is its counts over its own window, so a broker that restarted (its
    counters reset) or joined later adds what it did since it started. What a compacted topic
    keeps is read from the compactors' gauges (`kept`). A topic a broker hosts and has sealed
    nothing of yet is listed with zero counts (its settings are known).
    """
    after = list(after)
    prior = {(b.broker, b.started_s): b for b in before}
    counts: dict[str, TopicCounters] = {}
    rates: dict[str, TopicCounters] = {}
    windows: dict[str, float] = {}
    per_broker: dict[str, dict[str, float]] = {}
    for snap in after:
        base = prior.get((snap.broker, snap.started_s))
        since = snap.taken_s - (snap.started_s if base is None else base.taken_s)
        # a topic hosted here with nothing sealed yet has settings and no counters: it is listed too
        hosted = {**dict.fromkeys(snap.settings, TopicCounters()), **snap.topics}
        for topic, c in hosted.items():
            delta = c - base.topics.get(topic, TopicCounters()) if base is not None else c
            counts[topic] = counts.get(topic, TopicCounters()) + delta
            rate = delta.scaled(1 / max(since, 1e-9))
            rates[topic] = rates.get(topic, TopicCounters()) + rate
            windows[topic] = max(windows.get(topic, 0.0), since)
            per_broker.setdefault(topic, {})[snap.broker] = rate.bytes_in
    held = kept(after)
    seals = {t: [(s.broker, s.settings[t]) for s in after if t in s.settings] for t in counts}
    return {t: Usage(t, windows[t], counts[t], rates[t], held.get(t), per_broker[t],
                     seals[t][0][1] if seals[t] else None, tuple(b for b, _ in seals[t])) for t in sorted(counts)}


def kept(snaps: Iterable[Snapshot]) -> dict[str, Compacted]:
    """Per compacted topic, what it keeps: each partition as the broker compacting it reports it
    (brokers compact different partitions: `compaction.plan.compactor_of`). A broker drops a
    partition's gauges at its first pass after the partition moved; until then two report it, and
    the larger parts win."""
    merged: dict[str, dict[str, PartitionGauges]] = {}
    for snap in snaps:
        for topic, per in snap.compaction.items():
            mine = merged.setdefault(topic, {})
            for p, g in per.items():
                if p not in mine or g[0] > mine[p][0]:
                    mine[p] = g
    out: dict[str, Compacted] = {}
    for topic, per in sorted(merged.items()):
        c = compacted_of({p: g[0] for p, g in per.items()}, {p: g[1] for p, g in per.items()})
        if c is not None:
            out[topic] = c
    return out

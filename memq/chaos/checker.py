"""The verdict of one chaos run, from what the clients saw and what the servers hold. No I/O.

Inputs are plain records the workload logs (every producer ack, every consumer delivery) and
the independent read after the run (every notification decoded, every S3 object decoded).
A record is *reachable* when an object that some notification points at contains it: that is
what any reader can ever get. Acked-but-unreachable is lost; a notification whose object is
absent is a dangling pointer (readers stop on it with DataLossError). A delivery of a record
already delivered is a redelivery, counted against the fault that last started before it
(a SIGKILLed consumer's restart re-reads what it had not committed: at-least-once). Write
amplification is the record copies in storage (every object, announced or not) over the
records acked: 1.0 when every acked record was written once, more when resends were stored.

The transactional workload adds `check_txn`: no record of an aborted transaction is reachable
or read by anyone, no transaction is partly visible (all or nothing, in doubt included), and a new
read_committed reader reading from the start gets every committed record exactly once.

A compacted topic keeps only the latest record per key, so "every acked record is reachable"
does not hold there by design; its rule is `check_compacted`: reading the topic from earliest
(the compacted prefix, then the tail: the partition log model's segments, `memq.log.model`, as
memq's Consumer reads them in the workload), the last record of each key is the key's latest acked
write, or one that may have been ordered after it (it was not done before that write began);
a key whose latest acked write is a tombstone may be absent. With several read partitions the
rule holds per partition: records are placed by key (memq.client.placement, the Kafka door takes
the client's partition), so every record of a key is in one partition, whose order is its order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AckEvent:
    """How one send ended: `ok` with the ack time, or failed/unresolved at `done_s`."""

    producer: str
    record_id: str
    sent_s: float
    done_s: float
    ok: bool


@dataclass(frozen=True)
class Delivered:
    record_id: str
    at_s: float


@dataclass(frozen=True)
class Pointer:
    """One decoded notification: where it sits on Kafka and the object key it names."""

    partition: int
    offset: int
    key: str


@dataclass(frozen=True)
class StoredObject:
    """One object of the S3 listing and the record ids decoded from it."""

    key: str
    record_ids: tuple[str, ...]


@dataclass(frozen=True)
class FaultWindow:
    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Observations:
    acks: Sequence[AckEvent]
    delivered: Sequence[Delivered]
    pointers: Sequence[Pointer]
    objects: Sequence[StoredObject]
    faults: Sequence[FaultWindow] = ()
    run_start_s: float = 0.0
    produce_end_s: float = 0.0


@dataclass(frozen=True)
class FaultRow:
    name: str
    start_s: float
    end_s: float
    sends: int                       # sends started inside the window
    failed: int                      # of those, failed or never resolved
    acked_lost: int                  # of those, acked but unreachable
    heal_to_first_ack_s: float | None  # None: no ack after the heal
    max_write_gap_s: float           # longest stretch without an ack, from the start to the first ack after
    redelivered: int                 # deliveries of already delivered records, until the next fault
    write_amplification: float | None = None   # copies stored of the records sent inside / those acked


@dataclass(frozen=True)
class Verdict:
    sends: int
    acked: int
    acked_lost: int                  # must be 0
    consumer_missed: int             # acked, reachable, yet never delivered to the group
    duplicates: int                  # deliveries beyond the first of a record id
    stored_duplicates: int           # reachable copies beyond the first of a record id
    unacked_but_present: int         # allowed (the ack was lost, not the data), counted
    dangling_pointers: int           # must be 0
    orphan_objects: int              # collected later by retention, counted
    max_write_gap_s: float
    catch_up_s: float | None         # end of producing -> last delivery; None: never caught up
    write_amplification: float = 0.0  # record copies stored / records acked
    faults: tuple[FaultRow, ...] = field(default=())
    lost_ids: tuple[str, ...] = field(default=())   # a sample, for the report

    @property
    def passed(self) -> bool:
        return self.acked_lost == 0 and self.dangling_pointers == 0 and self.consumer_missed == 0

    def problems(self) -> list[str]:
        """Why the run failed, one line each (empty when it passed)."""
        out = []
        if self.acked_lost:
            out.append(f"{self.acked_lost} acked records lost (e.g. {', '.join(self.lost_ids[:5])})")
        if self.dangling_pointers:
            out.append(f"{self.dangling_pointers} notifications point at missing objects")
        if self.consumer_missed:
            out.append(f"{self.consumer_missed} acked records never delivered to the consumer group")
        return out


def check(obs: Observations) -> Verdict:
    listed = {o.key: o for o in obs.objects}
    pointed = {p.key for p in obs.pointers}
    reachable = Counter(rid for p in obs.pointers if p.key in listed for rid in listed[p.key].record_ids)
    # Two notifications naming one key are one batch re-announced, not two copies.
    distinct_reach = Counter(rid for k in pointed if k in listed for rid in listed[k].record_ids)
    acked = {a.record_id for a in obs.acks if a.ok}
    delivered = Counter(d.record_id for d in obs.delivered)
    lost = sorted(acked - reachable.keys())
    missed = len((acked & reachable.keys()) - delivered.keys())
    copies = Counter(rid for o in obs.objects for rid in o.record_ids)
    ack_times = sorted(a.done_s for a in obs.acks if a.ok)
    redelivered = _redelivery_times(obs.delivered)
    windows = sorted(obs.faults, key=lambda f: f.start_s)
    ends = [f.start_s for f in windows[1:]] + [float("inf")]
    return Verdict(
        sends=len({a.record_id for a in obs.acks}),
        acked=len(acked),
        acked_lost=len(lost),
        consumer_missed=missed,
        duplicates=sum(n - 1 for n in delivered.values()),
        stored_duplicates=sum(n - 1 for n in distinct_reach.values()),
        unacked_but_present=len(reachable.keys() - acked),
        dangling_pointers=sum(1 for p in obs.pointers if p.key not in listed),
        orphan_objects=sum(1 for k in listed if k not in pointed),
        max_write_gap_s=_max_gap(ack_times, obs.run_start_s, obs.produce_end_s),
        catch_up_s=None if missed or not obs.delivered
        else max(0.0, max(d.at_s for d in obs.delivered) - obs.produce_end_s),
        write_amplification=copies.total() / len(acked) if acked else 0.0,
        faults=tuple(_fault_row(f, obs, set(lost), ack_times, [t for t in redelivered if f.start_s <= t < until],
                                copies)
                     for f, until in zip(windows, ends)),
        lost_ids=tuple(lost[:20]),
    )


def _max_gap(times: Sequence[float], start: float, end: float) -> float:
    """Longest stretch of [start, end] without a successful ack (times sorted)."""
    edges = [start, *(t for t in times if start <= t <= end), max(end, start)]
    return max((b - a for a, b in zip(edges, edges[1:])), default=0.0)


def _redelivery_times(delivered: Iterable[Delivered]) -> list[float]:
    seen: set[str] = set()
    out = []
    for d in sorted(delivered, key=lambda d: d.at_s):
        if d.record_id in seen:
            out.append(d.at_s)
        seen.add(d.record_id)
    return out


def _fault_row(f: FaultWindow, obs: Observations, lost: set[str], ack_times: Sequence[float],
               redelivered: Sequence[float], copies: Counter[str]) -> FaultRow:
    inside = [a for a in obs.acks if f.start_s <= a.sent_s <= f.end_s]
    after = next((t for t in ack_times if t >= f.end_s), None)
    gap_end = after if after is not None else max(f.end_s, obs.produce_end_s)
    acked = sum(1 for a in inside if a.ok)
    return FaultRow(f.name, f.start_s, f.end_s, len(inside), sum(1 for a in inside if not a.ok),
                    sum(1 for a in inside if a.ok and a.record_id in lost),
                    None if after is None else after - f.end_s,
                    _max_gap(ack_times, f.start_s, gap_end), len(redelivered),
                    sum(copies[a.record_id] for a in inside) / acked if acked else None)


COMMIT, ABORT, DOUBT = "commit", "abort", "doubt"


@dataclass(frozen=True)
class TxnWrite:
    """One record of the transactional workload and how its transaction ended: COMMIT (the commit
    returned: acked), ABORT (never committed: must never be seen) or DOUBT (all of it or none)."""

    record_id: str
    txn: str
    outcome: str


@dataclass(frozen=True)
class TxnVerdict:
    transactions: int
    committed: int                   # records of committed transactions
    aborted: int                     # records of aborted ones
    in_doubt: int                    # records of transactions whose end the producer does not know
    aborted_visible: int             # must be 0: aborted records reachable (published), delivered or read
    torn: int                        # must be 0: transactions partly visible
    read_missed: int                 # must be 0: committed records the read_committed reader did not get
    read_duplicates: int             # must be 0: records the read_committed reader got more than once
    sample: tuple[str, ...] = field(default=())   # aborted-visible or missed ids, for the report

    @property
    def passed(self) -> bool:
        return not (self.aborted_visible or self.torn or self.read_missed or self.read_duplicates)

    def problems(self) -> list[str]:
        out = []
        if self.aborted_visible:
            out.append(f"{self.aborted_visible} records of aborted transactions visible")
        if self.torn:
            out.append(f"{self.torn} transactions partly visible")
        if self.read_missed:
            out.append(f"{self.read_missed} committed records missed by the read_committed reader")
        if self.read_duplicates:
            out.append(f"{self.read_duplicates} records read twice by the read_committed reader")
        return out + ([f"e.g. {', '.join(self.sample[:5])}"] if out and self.sample else [])


def check_txn(writes: Sequence[TxnWrite], pointers: Sequence[Pointer], objects: Sequence[StoredObject],
              read: Sequence[str], delivered: Iterable[str] = ()) -> TxnVerdict:
    """`read`: the record ids a new read_committed reader got from the start after the run;
    `delivered`: those the workload's group got during it (both count as visible)."""
    listed = {o.key: o for o in objects}
    got = Counter(read)
    visible = {rid for k in {p.key for p in pointers} if k in listed for rid in listed[k].record_ids}
    visible |= got.keys() | set(delivered)
    by_txn: dict[str, list[TxnWrite]] = {}
    for w in writes:
        by_txn.setdefault(w.txn, []).append(w)
    shown = [w.record_id for w in writes if w.outcome == ABORT and w.record_id in visible]
    missed = [w.record_id for w in writes if w.outcome == COMMIT and w.record_id not in got]
    return TxnVerdict(
        transactions=len(by_txn),
        committed=sum(w.outcome == COMMIT for w in writes),
        aborted=sum(w.outcome == ABORT for w in writes),
        in_doubt=sum(w.outcome == DOUBT for w in writes),
        aborted_visible=len(shown),
        torn=sum(0 < sum(w.record_id in visible for w in ws) < len(ws) for ws in by_txn.values()),
        read_missed=len(missed),
        read_duplicates=sum(n - 1 for n in got.values()),
        sample=tuple((shown + missed)[:20]),
    )


@dataclass(frozen=True)
class KeyedWrite:
    """One send to a compacted topic: its key, whether it was a tombstone, how it ended."""

    key: str
    record_id: str
    sent_s: float
    done_s: float
    ok: bool
    tombstone: bool = False


@dataclass(frozen=True)
class CompactedVerdict:
    keys: int                        # keys with an acked write
    lost: tuple[str, ...]            # keys whose latest acked value did not survive (must be empty)
    unknown: tuple[str, ...]         # keys whose surviving record no write of that key made (must be empty)

    @property
    def passed(self) -> bool:
        return not self.lost and not self.unknown

    def problems(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} keys lost their latest acked value (e.g. {', '.join(self.lost[:5])})")
        if self.unknown:
            out.append(f"{len(self.unknown)} keys read a record never written to them "
                       f"(e.g. {', '.join(self.unknown[:5])})")
        return out


def check_compacted(writes: Iterable[KeyedWrite], state: Mapping[str, str]) -> CompactedVerdict:
    """`state`: key -> record id of the last record of that key a reader from earliest got."""
    by_key: dict[str, list[KeyedWrite]] = {}
    for w in writes:
        by_key.setdefault(w.key, []).append(w)
    unknown = sorted(k for k in state if state[k] not in {w.record_id for w in by_key.get(k, ())})
    lost: list[str] = []
    for key, ws in sorted(by_key.items()):
        acked = [w for w in ws if w.ok]
        if not acked or key in unknown:
            continue
        latest = max(acked, key=lambda w: w.done_s)
        got = next((w for w in ws if w.record_id == state.get(key)), None)
        if got is None:
            if not latest.tombstone:
                lost.append(key)
        elif got is not latest and got.done_s < latest.sent_s:   # surely ordered before the latest
            lost.append(key)
    return CompactedVerdict(sum(1 for ws in by_key.values() if any(w.ok for w in ws)), tuple(lost),
                            tuple(unknown))

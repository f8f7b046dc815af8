"""Topic placement as a pure function: (brokers, topics, current) -> new assignment.

No I/O here, so every placement rule is unit-tested without ZooKeeper. Moving a topic moves
no data in memq (batches live in S3), but each move still makes producers reconnect, so the
default strategy is sticky and rate-limits optional rebalancing. Repairs (a broker died or
drains, a topic needs more brokers) are never rate-limited: they restore service.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memq.errors import ConfigError

Assignment = Mapping[str, tuple[str, ...]]
"""topic name -> ids of the brokers that host it."""

_EPS = 1e-9


@dataclass(frozen=True)
class BrokerInfo:
    """A registered broker. A draining broker keeps serving but is given no topics."""

    id: str
    url: str
    rack: str = ""
    capacity_mbps: float = 100.0
    draining: bool = False
    max_frame_bytes: int = 0   # passed on to clients in the metadata; 0 = not said
    kafka_address: str = ""    # its Kafka listener's "host:port", passed on likewise; "" = none

    def __post_init__(self) -> None:
        if self.capacity_mbps <= 0:
            raise ConfigError(f"broker {self.id}: capacity_mbps must be > 0")


@dataclass(frozen=True)
class TopicSpec:
    """What placement needs to know about a topic."""

    name: str
    expected_mbps: float = 1.0
    min_brokers: int = 2

    def __post_init__(self) -> None:
        if self.expected_mbps < 0:
            raise ConfigError(f"topic {self.name}: expected_mbps must be >= 0")
        if self.min_brokers < 1:
            raise ConfigError(f"topic {self.name}: min_brokers must be >= 1")


@dataclass(frozen=True)
class Move:
    """One topic's change of brokers, and why."""

    topic: str
    removed: tuple[str, ...]
    added: tuple[str, ...]
    reason: str  # new-topic | deleted | broker-lost | drain | traffic | rack-spread | rebalance


REPAIR_REASONS = frozenset({"new-topic", "deleted", "broker-lost", "drain", "traffic"})
"""Reasons that restore service; every other reason is optional and rate-limited."""


@dataclass(frozen=True)
class AssignmentResult:
    assignment: dict[str, tuple[str, ...]]
    moves: tuple[Move, ...] = ()
    warnings: tuple[str, ...] = ()
    out_of_capacity: bool = False
    broker_load_mbps: dict[str, float] = field(default_factory=dict)


class AssignmentStrategy(Protocol):
    """Pluggable placement: must be deterministic and free of I/O."""

    def __call__(self, brokers: Sequence[BrokerInfo], topics: Sequence[TopicSpec],
                 current: Assignment) -> AssignmentResult: ...


@dataclass(frozen=True)
class CapacityAssignment:
    """Default strategy: enough brokers per topic for its traffic, racks spread, sticky.

    - a topic gets max(min_brokers, ceil(expected_mbps / topic_share_mbps)) brokers (capped by
      the number of brokers), each taking an equal share of its traffic;
    - current placements on live, non-draining brokers are kept;
    - missing slots go to a broker with room for the share, on a rack the topic does not use
      yet, with the most free capacity (ties by id, for determinism);
    - at most `max_rebalance_moves` topics per cycle move for rack spread or uneven load
      (utilisation spread above `imbalance_threshold`, or a broker over capacity);
    - if the wanted placement does not fit, the current assignment is kept (only repairs
      applied) and `out_of_capacity` is set, instead of moving topics back and forth.
    """

    topic_share_mbps: float = 25.0
    max_rebalance_moves: int = 2
    imbalance_threshold: float = 0.2

    def __post_init__(self) -> None:
        if self.topic_share_mbps <= 0:
            raise ConfigError("assignment topic_share_mbps must be > 0")
        if self.max_rebalance_moves < 0:
            raise ConfigError("assignment max_rebalance_moves must be >= 0")

    def __call__(self, brokers: Sequence[BrokerInfo], topics: Sequence[TopicSpec],
                 current: Assignment) -> AssignmentResult:
        eligible = {b.id: b for b in sorted(brokers, key=lambda b: b.id) if not b.draining}
        specs = sorted(topics, key=lambda t: t.name)
        warnings: list[str] = []
        if not eligible:
            kept = {t.name: tuple(current.get(t.name, ())) for t in specs}
            return AssignmentResult(kept, (), ("no broker can take topics",) if specs else (),
                                    out_of_capacity=bool(specs))
        need = {t.name: self._need(t, len(eligible)) for t in specs}
        for t in specs:
            if need[t.name] < t.min_brokers:
                warnings.append(f"topic {t.name}: wants {t.min_brokers} brokers, only "
                                f"{len(eligible)} available")
        plan = _Plan(eligible, specs, current, need)
        plan.keep()
        fits = plan.fill(allow_overcommit=False)
        demand = sum(t.expected_mbps for t in specs)
        supply = sum(b.capacity_mbps for b in eligible.values())
        if fits and demand <= supply + _EPS:
            plan.rebalance(self.max_rebalance_moves, self.imbalance_threshold)
            over = [b for b in eligible if plan.load[b] > eligible[b].capacity_mbps + _EPS]
            warnings += [f"broker {b}: load {plan.load[b]:.1f} MB/s over capacity "
                         f"{eligible[b].capacity_mbps:.1f}" for b in over]
            return plan.result(brokers, warnings, out_of_capacity=False)
        # Out of capacity: keep what is there, only repair lost replicas and new topics.
        held = {t.name: min(len(eligible), max(t.min_brokers, len(current.get(t.name, ()))))
                for t in specs}
        plan = _Plan(eligible, specs, current, held)
        plan.keep()
        plan.fill(allow_overcommit=True)
        warnings.append(f"out of capacity: topics want {demand:.1f} MB/s, brokers offer "
                        f"{supply:.1f} MB/s; keeping the current assignment")
        return plan.result(brokers, warnings, out_of_capacity=True)

    def _need(self, t: TopicSpec, available: int) -> int:
        wanted = max(t.min_brokers, math.ceil(t.expected_mbps / self.topic_share_mbps - _EPS))
        return min(available, wanted)


class _Plan:
    """Mutable working state of one assignment computation."""

    def __init__(self, eligible: dict[str, BrokerInfo], specs: list[TopicSpec],
                 current: Assignment, need: dict[str, int]) -> None:
        self.eligible = eligible
        self.specs = specs
        self.current = current
        self.need = need
        self.share = {t.name: t.expected_mbps / max(1, need[t.name]) for t in specs}
        self.placement: dict[str, list[str]] = {}
        self.load: dict[str, float] = {b: 0.0 for b in eligible}
        self.reasons: dict[str, str] = {}

    def _free(self, b: str) -> float:
        return self.eligible[b].capacity_mbps - self.load[b]

    def _util(self, b: str) -> float:
        return self.load[b] / self.eligible[b].capacity_mbps

    def _racks(self, chosen: Sequence[str]) -> list[str]:
        return [self.eligible[b].rack for b in chosen if self.eligible[b].rack]

    def keep(self) -> None:
        """Keep current placements on eligible brokers, trimmed to the needed count."""
        for t in self.specs:
            kept = list(dict.fromkeys(b for b in self.current.get(t.name, ()) if b in self.eligible))
            if len(kept) > self.need[t.name]:
                self.reasons[t.name] = "traffic"
                # Drop the most loaded first, but never the last broker of a rack.
                while len(kept) > self.need[t.name]:
                    kept.remove(max(kept, key=lambda b: (self._racks(kept).count(self.eligible[b].rack)
                                                         if self.eligible[b].rack else 0,
                                                         self._util(b), b)))
            self.placement[t.name] = kept
            for b in kept:
                self.load[b] += self.share[t.name]

    def _pick(self, topic: str, chosen: list[str], share: float) -> str | None:
        used = set(self._racks(chosen))
        candidates = [b for b in self.eligible if b not in chosen]
        if not candidates:
            return None
        return min(candidates, key=lambda b: (self._free(b) + _EPS < share,
                                              self.eligible[b].rack in used,
                                              -self._free(b), b))

    def fill(self, *, allow_overcommit: bool) -> bool:
        """Fill missing slots, biggest shares first. False if some slot did not fit."""
        fits = True
        for t in sorted(self.specs, key=lambda t: (-self.share[t.name], t.name)):
            chosen = self.placement[t.name]
            while len(chosen) < self.need[t.name]:
                b = self._pick(t.name, chosen, self.share[t.name])
                if b is None:
                    break
                if self._free(b) + _EPS < self.share[t.name]:
                    fits = False
                    if not allow_overcommit and len(chosen) >= min(t.min_brokers, len(self.eligible)):
                        break
                chosen.append(b)
                self.load[b] += self.share[t.name]
        return fits

    def _move(self, topic: str, src: str, dst: str, reason: str) -> None:
        chosen = self.placement[topic]
        chosen[chosen.index(src)] = dst
        self.load[src] -= self.share[topic]
        self.load[dst] += self.share[topic]
        self.reasons.setdefault(topic, reason)

    def rebalance(self, budget: int, threshold: float) -> None:
        """Optional moves, at most `budget` topics: rack spread first, then load."""
        moved: set[str] = set()
        for t in self.specs:
            if len(moved) >= budget:
                return
            chosen = self.placement[t.name]
            racks = self._racks(chosen)
            dup = sorted(b for b in chosen if self.eligible[b].rack and racks.count(self.eligible[b].rack) > 1)
            if not dup:
                continue
            spare = [b for b in self.eligible if b not in chosen and self.eligible[b].rack
                     and self.eligible[b].rack not in racks
                     and self._free(b) + _EPS >= self.share[t.name]]
            if spare:
                src = max(dup, key=lambda b: (self._util(b), b))
                self._move(t.name, src, min(spare, key=lambda b: (-self._free(b), b)), "rack-spread")
                moved.add(t.name)
        while len(moved) < budget:
            best = self._best_load_move(moved, threshold)
            if best is None:
                return
            topic, src, dst = best
            self._move(topic, src, dst, "rebalance")
            moved.add(topic)

    def _best_load_move(self, moved: set[str], threshold: float) -> tuple[str, str, str] | None:
        hi = max(self.eligible, key=lambda b: (self._util(b), b))
        lo_util = min(self._util(b) for b in self.eligible)
        overloaded = self._free(hi) < -_EPS
        if not overloaded and self._util(hi) - lo_util <= threshold + _EPS:
            return None
        best: tuple[float, str, str, str] | None = None
        for topic in sorted(t for t, chosen in self.placement.items() if hi in chosen and t not in moved):
            share = self.share[topic]
            chosen = self.placement[topic]
            racks = set(self._racks(chosen))
            for dst in self.eligible:
                if dst in chosen or self._free(dst) + _EPS < share:
                    continue
                rest = [b for b in chosen if b != hi] + [dst]
                if len(set(self._racks(rest))) < len(racks):
                    continue  # never trade rack spread for balance
                after_hi = (self.load[hi] - share) / self.eligible[hi].capacity_mbps
                after_dst = (self.load[dst] + share) / self.eligible[dst].capacity_mbps
                peak = max(after_hi, after_dst)
                if peak + _EPS >= self._util(hi):
                    continue  # would not lower the hottest broker
                key = (peak, topic, dst, hi)
                if best is None or key < best:
                    best = key
        return None if best is None else (best[1], best[3], best[2])

    def result(self, brokers: Sequence[BrokerInfo], warnings: list[str], *,
               out_of_capacity: bool) -> AssignmentResult:
        live = {b.id for b in brokers}
        draining = {b.id for b in brokers if b.draining}
        final = {t: tuple(chosen) for t, chosen in sorted(self.placement.items())}
        moves: list[Move] = []
        for t, chosen in final.items():
            before = tuple(self.current.get(t, ()))
            removed = tuple(sorted(set(before) - set(chosen)))
            added = tuple(sorted(set(chosen) - set(before)))
            if not removed and not added:
                continue
            if not before:
                reason = "new-topic"
            elif any(b not in live for b in removed):
                reason = "broker-lost"
            elif any(b in draining for b in removed):
                reason = "drain"
            else:
                reason = self.reasons.get(t, "traffic")
            moves.append(Move(t, removed, added, reason))
        for t in sorted(set(self.current) - set(final)):
            moves.append(Move(t, tuple(self.current[t]), (), "deleted"))
        return AssignmentResult(final, tuple(moves), tuple(warnings), out_of_capacity,
                                {b: round(v, 6) for b, v in self.load.items()})

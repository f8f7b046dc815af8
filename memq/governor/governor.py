"""The governor: one elected process recomputes topic placement and writes assignments.

Every broker runs a `Governor`; a kazoo Lock elects one. The leader recomputes on every
change it watches (brokers come and go, topics change, drain flags) and every
`interval_s`, and writes assignments fenced by its lock znode, so a governor whose session
ended can never overwrite its successor. All state lives in ZooKeeper: a new governor
carries on from there.

After a ZooKeeper pause every session expires at once, and the first broker back wins the
election while the others are still re-registering. So while this governor's own session is
younger than `missing_grace_s`, an assigned broker missing from the registry is presumed
on its way back: its topics keep their brokers until it returns or the grace ends. A
governor on an older session (the usual case when one broker dies) repairs at once.

A broker that reports itself unhealthy (it cannot publish notifications) is given no topics,
like a draining one, unless every broker is: then moving would help nobody.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable

from kazoo.exceptions import KazooException, LockTimeout
from kazoo.protocol.states import KazooState
from kazoo.recipe.lock import Lock
from prometheus_client import CollectorRegistry, Counter, Gauge

from memq.errors import CoordinationError, LeadershipLostError

from .assignment import (REPAIR_REASONS, AssignmentResult, AssignmentStrategy, BrokerInfo, CapacityAssignment,
                         TopicSpec)
from .registry import Registry

log = logging.getLogger(__name__)


class GovernorMetrics:
    """The governor's Prometheus metrics, on a registry of its own unless one is passed in."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.leader = Gauge("memq_governor_leader", "1 while this process is the governor",
                            registry=self.registry)
        self.out_of_capacity = Gauge("memq_governor_out_of_capacity",
                                     "1 when topics want more than the brokers offer",
                                     registry=self.registry)
        self.cycles = Counter("memq_governor_cycles", "assignment computations", registry=self.registry)
        self.moves = Counter("memq_governor_moves", "topic placement changes written",
                             ["reason"], registry=self.registry)
        self.brokers = Gauge("memq_governor_brokers", "live brokers seen", registry=self.registry)
        self.topics = Gauge("memq_governor_topics", "topics seen", registry=self.registry)


class Governor:
    """Takes part in the election; while leading, keeps assignments up to date."""

    def __init__(self, registry: Registry, identifier: str, *,
                 strategy: AssignmentStrategy | None = None, interval_s: float = 5.0,
                 rebalance_interval_s: float | None = None, metrics: GovernorMetrics | None = None,
                 on_result: Callable[[AssignmentResult], None] | None = None,
                 missing_grace_s: float | None = None) -> None:
        self.registry = registry
        self.identifier = identifier
        self.strategy: AssignmentStrategy = strategy or CapacityAssignment()
        self.interval_s = interval_s
        self.rebalance_interval_s = interval_s if rebalance_interval_s is None else rebalance_interval_s
        self._last_rebalance = -math.inf
        self._warned: tuple[str, ...] = ()
        self.metrics = metrics or GovernorMetrics()
        self.on_result = on_result
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._session_lost = threading.Event()
        self._thread: threading.Thread | None = None
        # One lock for the governor's life: a contender znode whose create reply or delete was
        # lost stays in a session that lives on, first in line. kazoo's cleanup of it is best
        # effort, and a new Lock (new name prefix) would wait behind it forever, and so would
        # every other contender; the same Lock finds its own znode by prefix and takes it up.
        self.election_lock: Lock = registry.client.Lock(registry.election_path, identifier)
        self.leading = threading.Event()
        zk = registry.zk
        self.missing_grace_s = (missing_grace_s if missing_grace_s is not None else
                                zk.missing_broker_grace_s if zk.missing_broker_grace_s is not None else
                                zk.session_timeout_s)
        # (session id, when it began); a session that predates this governor counts as old
        self._session: tuple[int | None, float] = (registry.session_id, -math.inf)
        registry.add_listener(self._on_state)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"memq-governor-{self.identifier}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._poke.set()
        self.election_lock.cancel()  # wakes a contender waiting in acquire()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def poke(self, *_: object) -> None:
        """Recompute soon (watch callback; cheap and thread-safe)."""
        self._poke.set()

    def _on_state(self, state: KazooState) -> None:
        if state == KazooState.LOST:
            self._session_lost.set()
        elif state == KazooState.CONNECTED and self.registry.session_id != self._session[0]:
            self._session = (self.registry.session_id, time.monotonic())
        self._poke.set()

    def _grace_left(self) -> float:
        """Seconds until brokers missing from the registry count as dead (0: they do now)."""
        return max(0.0, self._session[1] + self.missing_grace_s - time.monotonic())

    def _run(self) -> None:
        lock = self.election_lock
        while not self._stop.is_set():
            try:
                if not self.registry.connected:
                    self._stop.wait(0.2)
                    continue
                self._session_lost.clear()
                lock.acquire(timeout=max(self.interval_s, 1.0))  # wakes at once when the holder goes
            except LockTimeout:
                continue
            except KazooException as e:
                if self._stop.is_set():
                    return  # stop() cancelled the wait (kazoo's CancelledError): not a failure
                # repr: kazoo's connection errors often carry no message, only their type
                log.warning("governor election failed, retrying: %r", e)
                self._stop.wait(0.5)
                continue
            try:
                self._lead(f"{self.registry.election_path}/{lock.node}")
            finally:
                self.leading.clear()
                self.metrics.leader.set(0)
                try:
                    if self.registry.connected:
                        lock.release()
                except KazooException as e:
                    # its znode stays first in line; the next acquire() finds it and takes it up
                    log.warning("governor could not release its election lock: %r", e)

    def _lead(self, fence: str) -> None:
        log.info("broker %s is now the governor", self.identifier)
        self.leading.set()
        self.metrics.leader.set(1)
        self._poke.set()
        while not self._stop.is_set() and not self._session_lost.is_set():
            self._poke.wait(self.interval_s)
            self._poke.clear()
            if self._stop.is_set() or self._session_lost.is_set():
                return
            if not self.registry.connected:
                continue  # suspended: wait for reconnect or loss
            try:
                self.cycle(fence)
            except LeadershipLostError as e:
                log.warning("%s", e)
                return
            except CoordinationError as e:
                log.warning("governor cycle failed, retrying: %s", e)
                self._stop.wait(0.5)
                self._poke.set()

    def cycle(self, fence: str | None = None) -> AssignmentResult:
        """Read the registry (re-arming watches), compute, write what changed."""
        state = self.registry.snapshot(watch=self.poke)
        specs = [TopicSpec(name, cfg.expected_mbps) for name, cfg in state.topics.items()]
        current = {t: bs for t, bs in state.assignments.items()}
        brokers = avoid_unhealthy(list(state.brokers.values()), state.unhealthy)
        result = self.strategy(brokers, specs, current)
        grace = self._grace_left()
        if grace > 0:
            missing = {b for bs in current.values() for b in bs} - set(state.brokers)
            if missing:
                result = hold_missing(result, current, missing)
                self._poke_in(grace)
        result = self._rate_limited(result, current)
        changes: dict[str, tuple[str, ...] | None] = {
            t: bs for t, bs in result.assignment.items() if current.get(t) != bs}
        changes.update({t: None for t in current if t not in result.assignment})
        self.registry.write_assignments(changes, fence=fence)
        self.metrics.cycles.inc()
        self.metrics.out_of_capacity.set(1 if result.out_of_capacity else 0)
        self.metrics.brokers.set(len(state.brokers))
        self.metrics.topics.set(len(state.topics))
        for m in result.moves:
            self.metrics.moves.labels(m.reason).inc()
            log.info("governor: topic %s %s: -%s +%s", m.topic, m.reason, list(m.removed), list(m.added))
        if result.warnings != self._warned:    # a standing condition is logged once, not every cycle
            self._warned = result.warnings
            for w in result.warnings:
                log.warning("governor: %s", w)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _rate_limited(self, result: AssignmentResult, current: dict[str, tuple[str, ...]]) -> AssignmentResult:
        """Optional moves at most once per `rebalance_interval_s`, however often watches fire.

        The strategy caps moves per computation; this caps computations that move, so a
        burst of registry events cannot turn into a burst of migrations.
        """
        optional = {m.topic for m in result.moves if m.reason not in REPAIR_REASONS}
        if not optional:
            return result
        now = time.monotonic()
        wait = self._last_rebalance + self.rebalance_interval_s - now
        if wait <= 0:
            self._last_rebalance = now
            return result
        self._poke_in(wait)
        kept = {t: (current[t] if t in optional else bs) for t, bs in result.assignment.items()}
        moves = tuple(m for m in result.moves if m.topic not in optional)
        return dataclasses.replace(result, assignment=kept, moves=moves)

    def _poke_in(self, delay_s: float) -> None:
        timer = threading.Timer(delay_s, self.poke)
        timer.daemon = True
        timer.start()


def avoid_unhealthy(brokers: list[BrokerInfo], unhealthy: dict[str, str]) -> list[BrokerInfo]:
    """Unhealthy brokers marked draining, unless no healthy broker would be left to take topics."""
    if not unhealthy or all(b.draining or b.id in unhealthy for b in brokers):
        return brokers
    return [dataclasses.replace(b, draining=True) if b.id in unhealthy else b for b in brokers]


def hold_missing(result: AssignmentResult, current: dict[str, tuple[str, ...]],
                 missing: set[str]) -> AssignmentResult:
    """`result` with every topic assigned to a `missing` broker left where it is."""
    held = {t for t, bs in current.items() if missing & set(bs) and t in result.assignment}
    if not held:
        return result
    log.info("governor: new session, brokers %s not re-registered yet: topics %s stay put",
             sorted(missing), sorted(held))
    kept = {t: (current[t] if t in held else bs) for t, bs in result.assignment.items()}
    moves = tuple(m for m in result.moves if m.topic not in held)
    return dataclasses.replace(result, assignment=kept, moves=moves)

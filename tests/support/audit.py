"""Audit test helpers: record builders for the books (pure), and the dev cluster's config and
traffic for the audit service."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from memq.audit.books import BOOKS_MS, BooksSettings
from memq.audit.emitter import AuditEmitter
from memq.audit.records import AuditRecord, Kind
from memq.config import MemqConfig

SETTINGS = BooksSettings(grace_ms=5_000, retention_ms=60_000, warn_lag_ms=3_000, stall_ms=4_000,
                         skew_ms=0)
T0 = 1_700_000_000_000 - 1_700_000_000_000 % BOOKS_MS   # a minute boundary


def prod(seq: int, count: int = 10, created: int = T0, acked: int | None = None, digest: int = 7,
         topic: str = "t", pid: int = 1) -> AuditRecord:
    return AuditRecord(Kind.PRODUCED, topic, "", pid, 0, seq, count, digest, created,
                       created + 5 if acked is None else acked)


def cons(seq: int, count: int = 10, created: int = T0, consumed: int | None = None,
         digest: int = 7, topic: str = "t", group: str = "g", pid: int = 1) -> AuditRecord:
    return AuditRecord(Kind.CONSUMED, topic, group, pid, 0, seq, count, digest, created,
                       created + 100 if consumed is None else consumed)


GRACE_S = 2.0
"""The audit's grace period in `audit_config`: how long after a Message its books are due."""


def audit_config(memq_config: MemqConfig, unique_name: Callable[[str], str], **audit: Any) -> MemqConfig:
    """The dev cluster's config with a private audit topic and a short grace period."""
    settings = {"topic": unique_name("audit"), "grace_s": GRACE_S, "flush_ms": 50,
                "partition_skew_s": 0.0, **audit}
    a = dataclasses.replace(memq_config.audit, **settings)
    return dataclasses.replace(memq_config, audit=a)


def emit_traffic(em: AuditEmitter, topic: str, group: str, *, messages: int, count: int,
                 lose: range = range(0), duplicate: range = range(0), corrupt: range = range(0),
                 first_seq: int = 0) -> int:
    """Report `messages` Messages as produced, and as consumed except `lose`; returns now_ms."""
    now = int(time.time() * 1000)
    for s in range(first_seq, first_seq + messages):
        created = now - 500 + s % 100
        em.produced(topic=topic, producer_id=42, epoch=1, sequence=s, count=count, digest=1000 + s,
                    created_ms=created)
        if s in lose:
            continue
        for _ in range(2 if s in duplicate else 1):
            em.consumed(topic=topic, group=group, producer_id=42, epoch=1, sequence=s, count=count,
                        digest=1000 + s + (s in corrupt), created_ms=created, consumed_ms=created + 80)
    assert em.flush(10) == 0 and em.stats().failed == 0 and em.stats().dropped == 0
    return now

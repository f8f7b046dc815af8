"""The whole cost view as JSON-ready data: each topic's bill (`model`) and its break-even
(`breakeven`), as `memq cost --json` prints it and the dashboard's /api/cost serves it. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Any

from memq.config import CostConfig

from . import breakeven
from .counters import Usage
from .model import as_dict, estimate, price_source


def report(brokers: list[str], used: dict[str, Usage], retention_s: float, p: CostConfig,
           only: Collection[str] = ()) -> dict[str, Any]:
    """Per topic (those in `only`, if given) its estimate and, under "break_even", its verdict
    (`breakeven.as_dict`; `used` holds every topic: a storage group's others count)."""
    topics = {}
    for t, u in used.items():
        if only and t not in only:
            continue
        e = estimate(u, retention_s, p)
        topics[t] = {**as_dict(u, e), "break_even": breakeven.as_dict(breakeven.verdict(u, used, retention_s, p, e))}
    return {"brokers": brokers, "prices": price_source(p), "price_table": dataclasses.asdict(p),
            "retention_days": retention_s / 86_400, "topics": topics}

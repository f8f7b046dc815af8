"""Read the cost counters of every broker of a cluster (blocking HTTP, bounded by timeouts).

The brokers are the ones named plus every broker their `/v1/metadata` lists (a governed
cluster lists all of them), so naming one broker is enough.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request

from memq.client.cluster import broker_urls, fetch_metadata
from memq.errors import BrokerUnavailableError

from .counters import Snapshot, parse_metrics

log = logging.getLogger(__name__)


def cluster_brokers(brokers: str, timeout_s: float) -> list[str]:
    """The named broker URLs and every broker their metadata lists, in order, without repeats."""
    named = broker_urls(brokers)
    if not named:
        raise BrokerUnavailableError("no broker URL given: use --brokers or [producer] brokers")
    found: list[str] = []
    errors: list[str] = []
    for url in named:
        try:
            md = fetch_metadata(url, timeout_s)
        except BrokerUnavailableError as e:
            errors.append(str(e))
            continue
        found += [url, *(b.url.rstrip("/") for b in md.brokers)]
    if not found:
        raise BrokerUnavailableError("; ".join(errors))
    return list(dict.fromkeys(found))


def scrape(urls: list[str], timeout_s: float) -> list[Snapshot]:
    """Every answering broker's counters; a broker that does not answer is logged and left out."""
    out: list[Snapshot] = []
    for url in urls:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=timeout_s) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError) as e:
            log.warning("broker %s: cannot read /metrics (%s): its counters are left out", url, e)
            continue
        out.append(parse_metrics(url, text, time.time()))
    if not out:
        raise BrokerUnavailableError(f"no broker answered /metrics ({', '.join(urls)})")
    return out

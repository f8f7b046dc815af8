"""Read the cost counters of every broker of a cluster (blocking HTTP, bounded by timeouts).

The brokers are the ones named plus every broker their `/v1/metadata` lists (a governed
cluster lists all of them), so naming one broker is enough.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request

from memq.client._auth import NO_AUTH, BrokerAuth
from memq.client.cluster import broker_urls, fetch_metadata
from memq.errors import BrokerUnavailableError

from .counters import Snapshot, parse_metrics

log = logging.getLogger(__name__)


def cluster_brokers(brokers: str, timeout_s: float, auth: BrokerAuth = NO_AUTH) -> list[str]:
    """The named broker URLs and every broker their metadata lists, in order, without repeats
    (asked with the client's credentials, `auth`)."""
    named = broker_urls(brokers)
    if not named:
        raise BrokerUnavailableError("no broker URL given: use --brokers or [producer] brokers")
    found: list[str] = []
    errors: list[str] = []
    for url in named:
        try:
            md = fetch_metadata(url, timeout_s, auth)
        except BrokerUnavailableError as e:
            errors.append(str(e))
            continue
        found += [url, *(b.url.rstrip("/") for b in md.brokers)]
    if not found:
        raise BrokerUnavailableError("; ".join(errors))
    return list(dict.fromkeys(found))


def scrape(urls: list[str], timeout_s: float, auth: BrokerAuth = NO_AUTH) -> list[Snapshot]:
    """Every answering broker's counters (https brokers verified as `auth` says); a broker that
    does not answer is logged and left out."""
    return [parse_metrics(url, text, at) for url, text, at in metrics_texts(urls, timeout_s, auth)]


def metrics_texts(urls: list[str], timeout_s: float, auth: BrokerAuth = NO_AUTH) -> list[tuple[str, str, float]]:
    """(url, Prometheus text, when read) of every answering broker's `/metrics`; a broker that
    does not answer is logged and left out, BrokerUnavailableError when none does."""
    out: list[tuple[str, str, float]] = []
    for url in urls:
        try:
            with urllib.request.urlopen(url + "/metrics", timeout=timeout_s, context=auth.ssl_context) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError) as e:
            log.warning("broker %s: cannot read /metrics (%s): its counters are left out", url, e)
            continue
        out.append((url, text, time.time()))
    if not out:
        raise BrokerUnavailableError(f"no broker answered /metrics ({', '.join(urls)})")
    return out

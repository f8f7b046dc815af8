"""The cost of security on produce: TLS + token authentication + ACLs vs plaintext, one run.

Two one-broker governed clusters on the same dev servers (moto S3, tansu, ZooKeeper): one
plaintext, one as `memq dev --tls` makes it (its CA and certificate, a token, ACLs allowing
it). The same memq Producer workload at ack=all goes to each, interleaved (plaintext, secured,
three times) and the best of each side is kept, so drift on a shared machine cancels:
- small: 100-byte values, msg/s; large: 64 KiB values, MB/s.
Ratios secured/plaintext (1.0 = free; higher is better).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

from bench.produce import BATCH_BYTES, LARGE, MiB, RING_SLOTS, SMALL, _values, memq_send_s
from memq.config import TopicConfig
from memq.devcluster import DevCluster, GovernedCluster
from memq.devcluster.secure import make_dev_security

ROUNDS = 3


def run(quick: bool) -> dict:
    n_small = 400_000 if quick else 2_000_000
    large_bytes = 256 * MiB if quick else 1024 * MiB
    topics = (TopicConfig("sec-small", batch_bytes=BATCH_BYTES, ring_slots=RING_SLOTS),
              TopicConfig("sec-large", batch_bytes=BATCH_BYTES, ring_slots=RING_SLOTS, batch_ms=2_000))
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(Path(tmp) / "plain", brokers=1, servers=dc, cluster="benchplain") as plain, \
            GovernedCluster(Path(tmp) / "secured", brokers=1, servers=dc, cluster="benchsecure",
                            security=make_dev_security(Path(tmp) / "tls")) as secured:
        for gc in (plain, secured):
            for topic in topics:
                gc.create_topic(topic)
        sides = {"plaintext": plain.config().producer, "tls+auth": secured.config().producer}
        print(f"plaintext broker {plain.broker('b1').url}, secured broker {secured.broker('b1').url}", flush=True)
        small = _values(SMALL, n_small)
        large = [os.urandom(LARGE) for _ in range(large_bytes // LARGE)]
        for pc in sides.values():                                  # warm up connections and TLS sessions
            asyncio.run(memq_send_s(pc, "sec-small", small[:20_000]))
        best: dict[tuple[str, str], float] = {}
        for _ in range(ROUNDS):
            for name, pc in sides.items():
                rate = n_small / asyncio.run(memq_send_s(pc, "sec-small", small))
                mbps = large_bytes / MiB / asyncio.run(memq_send_s(pc, "sec-large", large))
                best[name, "small"] = max(best.get((name, "small"), 0.0), rate)
                best[name, "large"] = max(best.get((name, "large"), 0.0), mbps)
                print(f"{name:>9}: {SMALL} B {rate:,.0f} msg/s, 64 KiB {mbps:,.1f} MB/s", flush=True)
    ratios = {f"tls_auth_vs_plaintext_{case}": round(best["tls+auth", case] / best["plaintext", case], 3)
              for case in ("small", "large")}
    return {"ratios": ratios,
            "plaintext_small_msg_s": round(best["plaintext", "small"]),
            "secured_small_msg_s": round(best["tls+auth", "small"]),
            "plaintext_large_mb_s": round(best["plaintext", "large"], 1),
            "secured_large_mb_s": round(best["tls+auth", "large"], 1),
            "small_messages": n_small, "large_bytes": large_bytes}

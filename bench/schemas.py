"""The schema registry: register and look-up latency through a broker's registry door.

One dev cluster (moto S3, tansu, ZooKeeper) and two governed brokers. Registrations alternate
between the brokers (a new subject and a new schema each: an id allocated in ZooKeeper every
time); look-ups are `GET /schemas/ids/{id}` (what a deserializer asks; the broker's cache of
ids) and `POST /subjects/{s}` (a serializer's look-up: the subject read from ZooKeeper), on
one keep-alive HTTP connection per broker, as a client does.
Ratios: `register_vs_goal` (the goal, 50 ms, over the register p99), `id_lookup_vs_goal` and
`subject_lookup_vs_goal` (10 ms over each look-up's p99); >= 1 meets the goal. Raw figures:
p50 and p99 seconds of each. (The produce-time payload checks of issue 48, and their
`checked_vs_plain_<format>` ratios, are not built yet.)
"""

from __future__ import annotations

import http.client
import json
import tempfile
import time
import urllib.parse
from pathlib import Path

from bench.e2e import quantile
from memq.devcluster import DevCluster, GovernedCluster

REGISTER_GOAL_S = 0.050
LOOKUP_GOAL_S = 0.010


def _connection(url: str) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=10)


def _call(conn: http.client.HTTPConnection, method: str, path: str, body: object = None) -> tuple[float, object]:
    data = None if body is None else json.dumps(body).encode()
    t0 = time.perf_counter()
    conn.request(method, path, body=data, headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    r = conn.getresponse()
    answer = json.loads(r.read())
    took = time.perf_counter() - t0
    assert r.status == 200, answer
    return took, answer


def _schema(i: int) -> dict:
    return {"schema": json.dumps({"type": "record", "name": f"R{i}", "namespace": "bench", "fields": [
        {"name": "id", "type": "long"}, {"name": "name", "type": "string"},
        {"name": "tags", "type": {"type": "array", "items": "string"}, "default": []}]})}


def run(quick: bool) -> dict:
    n = 200 if quick else 1000
    with tempfile.TemporaryDirectory(prefix="memq-bench-") as tmp, DevCluster(Path(tmp) / "servers") as dc, \
            GovernedCluster(tmp, brokers=2, servers=dc, cluster="bench") as gc:
        conns = [_connection(gc.broker(b).url) for b in ("b1", "b2")]
        register, ids = [], []
        for i in range(n):
            took, answer = _call(conns[i % 2], "POST", f"/subjects/s{i}/versions", _schema(i))
            register.append(took)
            ids.append(answer["id"])   # type: ignore[index]
        by_id = [_call(conns[i % 2], "GET", f"/schemas/ids/{ids[i]}")[0] for i in range(n)]
        by_id = [_call(conns[i % 2], "GET", f"/schemas/ids/{ids[i]}")[0] for i in range(n)]   # warm: cached
        by_subject = [_call(conns[i % 2], "POST", f"/subjects/s{i}", _schema(i))[0] for i in range(n)]
        for c in conns:
            c.close()
    figures = {name: {"p50_s": quantile(sorted(xs), 0.5), "p99_s": quantile(sorted(xs), 0.99)}
               for name, xs in (("register", register), ("id_lookup", by_id), ("subject_lookup", by_subject))}
    for name, f in figures.items():
        print(f"{name}: p50 {f['p50_s'] * 1000:.2f} ms, p99 {f['p99_s'] * 1000:.2f} ms", flush=True)
    return {"ratios": {"register_vs_goal": REGISTER_GOAL_S / figures["register"]["p99_s"],
                       "id_lookup_vs_goal": LOOKUP_GOAL_S / figures["id_lookup"]["p99_s"],
                       "subject_lookup_vs_goal": LOOKUP_GOAL_S / figures["subject_lookup"]["p99_s"]},
            "records": n, **figures}

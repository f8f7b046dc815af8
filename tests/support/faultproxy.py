"""A fault-injecting HTTP proxy for tests: a real aiohttp server on 127.0.0.1 in a thread.

It forwards requests to an upstream (the moto S3 server) and, for the requests a
`FaultPlan` selects, answers a real HTTP fault instead:

- `slowdown`: 503 with S3's `SlowDown` XML error body, without touching the upstream;
- `error`: any status and S3 error code (e.g. 403 AccessDenied), without touching the upstream;
- `stall`: forward the request (so a PUT does land upstream), then hold the response for
  `stall_s`, longer than the client's read timeout: the client sees a timeout while the
  object exists, which is what makes per-attempt keys matter;
- `reset`: drop the TCP connection without an answer (a crashed or restarted endpoint).

Every request is logged as (method, path, fault or "") so tests can check what happened.
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass, field
from typing import Literal

import aiohttp
from aiohttp import web

_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect",
                          "keep-alive", "content-encoding"})


@dataclass
class FaultPlan:
    """Which requests to fault: the first `first_n` matching ones, then a `fraction` of the rest."""

    mode: Literal["none", "slowdown", "error", "stall", "reset"] = "none"
    first_n: int = 0
    fraction: float = 0.0
    methods: frozenset[str] = frozenset({"GET", "PUT", "HEAD", "DELETE", "POST"})
    path_contains: str = ""
    status: int = 503
    code: str = "SlowDown"
    stall_s: float = 2.0
    seed: int = 0
    once_per_path: bool = False      # fault only the first selected request of each path
    _matched: int = field(default=0, repr=False)
    _faulted: set[str] = field(default_factory=set, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    def select(self, method: str, path: str) -> bool:
        if self.mode == "none" or method not in self.methods or self.path_contains not in path:
            return False
        self._matched += 1
        if self.once_per_path and path in self._faulted:
            return False
        chosen = self._matched <= self.first_n or self._rng.random() < self.fraction
        if chosen:
            self._faulted.add(path)
        return chosen


def s3_error_body(code: str, message: str, resource: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
            f"<Message>{message}</Message><Resource>{resource}</Resource>"
            f"<RequestId>faultproxy</RequestId></Error>").encode()


class FaultProxy:
    """`with FaultProxy(upstream_url) as proxy:` ... point the S3 client at `proxy.url`."""

    def __init__(self, upstream_url: str, plan: FaultPlan | None = None) -> None:
        self.upstream_url = upstream_url.rstrip("/")
        self._lock = threading.Lock()
        self._plan = plan or FaultPlan()
        self.log: list[tuple[str, str, str]] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="faultproxy", daemon=True)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def set_plan(self, plan: FaultPlan) -> None:
        with self._lock:
            self._plan = plan
            self.log.clear()

    def faults(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return [entry for entry in self.log if entry[2]]

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30),
                                              auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            plan = self._plan
            fault = plan.mode if plan.select(request.method, request.path) else ""
            self.log.append((request.method, request.path, fault))
        if fault == "slowdown":
            return web.Response(status=503, body=s3_error_body("SlowDown", "Please reduce your request rate.",
                                                               request.path),
                                content_type="application/xml")
        if fault == "error":
            return web.Response(status=plan.status, body=s3_error_body(plan.code, "injected by faultproxy",
                                                                       request.path),
                                content_type="application/xml")
        if fault == "reset" and request.transport is not None:
            request.transport.abort()
            raise web.HTTPServiceUnavailable()  # never sent: the connection is gone
        upstream = await self._forward(request)
        if fault == "stall":
            await asyncio.sleep(plan.stall_s)
        return upstream

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["Host"] = request.host
        async with self._session.request(request.method, self.upstream_url + request.path_qs,
                                         headers=headers, data=body) as resp:
            data = await resp.read()
            out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
            return web.Response(status=resp.status, body=data if request.method != "HEAD" else None,
                                headers=out_headers)

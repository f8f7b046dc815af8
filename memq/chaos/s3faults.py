"""An HTTP proxy in front of the chaos cluster's S3 that misbehaves as S3 does under load.

Some S3 faults need HTTP, not packets: `503 SlowDown` for a share of requests (S3's per-prefix
throttling, and the recovery storm after an outage), and a tail (a share of answers held back,
as S3 Standard answers some requests in hundreds of ms). This proxy runs in the S3 host, in
every client's path (an iptables REDIRECT, as for `memq.chaos.linkproxy`), forwards requests
unchanged and, per request, draws whether to answer SlowDown itself or to hold the upstream's
answer for `tail_delay_s`. The harness sets the shares at any time by rewriting the control
file (JSON of `S3Faults`).

`python -m memq.chaos.s3faults --listen IP:PORT --upstream IP:PORT --control FILE`
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from memq.chaos.linkproxy import CONTROL_POLL_S, proxy_args
from memq.errors import ConfigError

MAX_BODY = 256 * 1024 * 1024
_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "expect",
                          "keep-alive", "content-encoding"})


@dataclass(frozen=True)
class S3Faults:
    """Shares of requests answered 503 SlowDown, and delayed by `tail_delay_s`."""

    slowdown_share: float = 0.0
    tail_share: float = 0.0
    tail_delay_s: float = 0.5

    def __post_init__(self) -> None:
        if not (0 <= self.slowdown_share <= 1 and 0 <= self.tail_share <= 1 and self.tail_delay_s >= 0):
            raise ConfigError(f"S3 faults: shares {self.slowdown_share}, {self.tail_share} must be in [0, 1], "
                              f"tail delay {self.tail_delay_s} s >= 0")

    def write(self, path: Path) -> None:
        """Replace the control file atomically (the proxy never reads half of it)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> S3Faults:
        """The faults in `path`; no file (or an unreadable one) is none."""
        try:
            raw = json.loads(path.read_text())
            return cls(float(raw["slowdown_share"]), float(raw["tail_share"]), float(raw["tail_delay_s"]))
        except (OSError, ValueError, KeyError, TypeError, ConfigError):
            return cls()


def slowdown_body(resource: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            f"<Message>Please reduce your request rate.</Message><Resource>{resource}</Resource>"
            f"<RequestId>memq-chaos</RequestId></Error>").encode()


class S3FaultProxy:
    """Forwards every request to `upstream`, faulted as the control file says."""

    def __init__(self, upstream: tuple[str, int], control: Path, seed: int = 0) -> None:
        self.upstream_url = f"http://{upstream[0]}:{upstream[1]}"
        self.control = control
        self.faults = S3Faults.read(control)
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None

    async def follow_control(self) -> None:
        seen = None
        while True:
            with contextlib.suppress(OSError):
                mtime = self.control.stat().st_mtime_ns
                if mtime != seen:
                    seen, self.faults = mtime, S3Faults.read(self.control)
            await asyncio.sleep(CONTROL_POLL_S)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        faults = self.faults
        if self._rng.random() < faults.slowdown_share:
            await request.read()
            return web.Response(status=503, body=slowdown_body(request.path), content_type="application/xml")
        delay_s = faults.tail_delay_s if self._rng.random() < faults.tail_share else 0.0
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers["Host"] = request.host
        async with self._session.request(request.method, self.upstream_url + request.path_qs, headers=headers,
                                         data=await request.read()) as resp:
            body = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP_HEADERS}
        if delay_s:
            await asyncio.sleep(delay_s)
        return web.Response(status=resp.status, body=body if request.method != "HEAD" else None, headers=out)


async def serve(listen: tuple[str, int], proxy: S3FaultProxy) -> None:
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *listen).start()
    await proxy.follow_control()


def main(argv: list[str] | None = None) -> int:
    args = proxy_args("python -m memq.chaos.s3faults", argv)
    asyncio.run(serve(args.listen, S3FaultProxy(args.upstream, args.control, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

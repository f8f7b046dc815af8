"""An HTTP proxy in front of the chaos cluster's S3 that misbehaves as S3 does under load.

Some S3 faults need HTTP, not packets: `503 SlowDown` for a share of requests (S3's per-prefix
throttling, and the recovery storm after an outage), and a tail (a share of answers held back,
as S3 Standard answers some requests in hundreds of ms). This proxy runs in the S3 host, in
every client's path (an iptables REDIRECT, as for `memq.chaos.linkproxy`), forwards requests
unchanged and, per request, draws whether to answer SlowDown itself or to hold the upstream's
answer for `tail_delay_s`. The harness sets the shares at any time by rewriting the control
file (JSON of `S3Faults`). With `--counts FILE` it appends, about once a second, a JSON line of
its running totals (requests received, of them answered SlowDown) with the wall time, so a run
can tell how many requests per second S3 got before, during and after a fault.

`python -m memq.chaos.s3faults --listen IP:PORT --upstream IP:PORT --control FILE [--counts FILE]`
`local_fault_proxy` runs one on 127.0.0.1 in front of a local S3 (the benchmarks' S3 link).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from memq.chaos.linkproxy import CONTROL_POLL_S, proxy_parser
from memq.devcluster.process import free_port, spawn, wait_ready
from memq.errors import ConfigError, DevClusterError

MAX_BODY = 256 * 1024 * 1024
COUNTS_EVERY_S = 1.0
READY_TIMEOUT_S = 30.0
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


@dataclass(frozen=True)
class RequestCount:
    """The proxy's running totals at wall time `at_s`: requests received, of them answered SlowDown."""

    at_s: float
    requests: int
    slowdowns: int

    @classmethod
    def load(cls, path: Path) -> list[RequestCount]:
        """A counts file's samples, oldest first; a line torn by a killed proxy is skipped."""
        out = []
        with contextlib.suppress(FileNotFoundError):
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    raw = json.loads(line)
                    out.append(cls(float(raw["at_s"]), int(raw["requests"]), int(raw["slowdowns"])))
        return out


def slowdown_body(resource: str) -> bytes:
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            f"<Message>Please reduce your request rate.</Message><Resource>{resource}</Resource>"
            f"<RequestId>memq-chaos</RequestId></Error>").encode()


class S3FaultProxy:
    """Forwards every request to `upstream`, faulted as the control file says."""

    def __init__(self, upstream: tuple[str, int], control: Path, seed: int = 0, counts: Path | None = None) -> None:
        self.upstream_url = f"http://{upstream[0]}:{upstream[1]}"
        self.control = control
        self.counts = counts
        self.faults = S3Faults.read(control)
        self.requests = self.slowdowns = 0
        self._rng = random.Random(seed)
        self._session: aiohttp.ClientSession | None = None

    async def follow_control(self) -> None:
        seen = None
        counted = 0.0
        while True:
            with contextlib.suppress(OSError):
                mtime = self.control.stat().st_mtime_ns
                if mtime != seen:
                    seen, self.faults = mtime, S3Faults.read(self.control)
            if self.counts is not None and time.monotonic() - counted >= COUNTS_EVERY_S:
                counted = time.monotonic()
                self._write_counts(self.counts)
            await asyncio.sleep(CONTROL_POLL_S)

    def _write_counts(self, path: Path) -> None:
        with contextlib.suppress(OSError), path.open("a") as f:
            f.write(json.dumps(asdict(RequestCount(time.time(), self.requests, self.slowdowns))) + "\n")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        faults = self.faults
        self.requests += 1
        if self._rng.random() < faults.slowdown_share:
            self.slowdowns += 1
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


@dataclass(frozen=True)
class LocalFaultProxy:
    """A running proxy on 127.0.0.1: its `url` for S3 clients, faults set with `set`."""

    url: str
    control: Path

    def set(self, faults: S3Faults) -> None:
        faults.write(self.control)
        time.sleep(3 * CONTROL_POLL_S)      # the proxy polls its control file


@contextlib.contextmanager
def local_fault_proxy(upstream_url: str, work_dir: Path, faults: S3Faults = S3Faults(),
                      seed: int = 0) -> Iterator[LocalFaultProxy]:
    """A proxy process on 127.0.0.1 in front of the S3 at `upstream_url` (http://127.0.0.1:PORT),
    stopped on exit; its log goes to `work_dir`."""
    port, control = free_port(), work_dir / "s3faults.json"
    faults.write(control)
    argv = [sys.executable, "-m", "memq.chaos.s3faults", "--listen", f"127.0.0.1:{port}",
            "--upstream", upstream_url.removeprefix("http://"), "--control", str(control), "--seed", str(seed)]
    proc = spawn("s3-faults", argv, log_path=work_dir / "s3faults.log")
    try:
        if not wait_ready(proc, lambda: _listening(port), READY_TIMEOUT_S):
            raise DevClusterError(f"S3 fault proxy exited; log:\n{proc.log_tail()}")
        yield LocalFaultProxy(f"http://127.0.0.1:{port}", control)
    finally:
        proc.stop(5.0)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        return True
    except OSError:
        return False


async def serve(listen: tuple[str, int], proxy: S3FaultProxy) -> None:
    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, *listen).start()
    await proxy.follow_control()


def main(argv: list[str] | None = None) -> int:
    parser = proxy_parser("python -m memq.chaos.s3faults")
    parser.add_argument("--counts", type=Path, default=None, help="append running request totals here")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, S3FaultProxy(args.upstream, args.control, args.seed, args.counts)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A TCP proxy that degrades a link: delay with jitter, per direction, stream order kept.

The kernels the harness runs on have no `tc netem`, so a delayed link is this userspace proxy
in the server's host: an iptables REDIRECT there sends every connection to the server's port
through it, so clients and servers keep their addresses. It holds each chunk it reads until
`now + delay ± jitter` (never before the chunk ahead of it: a TCP stream cannot reorder) and
only for clients whose address is in `peers` (all when empty). The harness changes the shape
at any time by rewriting the control file (JSON of `LinkShape`); established connections feel
it at once, as they would on a real link. (HTTP-level S3 faults are tests/support/faultproxy.py.)

`python -m memq.chaos.linkproxy --listen IP:PORT --upstream IP:PORT --control FILE`
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from memq.errors import ConfigError

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256          # per direction: a delayed link holds at most this much in flight
CONTROL_POLL_S = 0.1
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class LinkShape:
    """Extra one-way latency: `delay_s` ± uniform `jitter_s` per chunk, for clients in `peers`."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    peers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.delay_s < 0 or self.jitter_s < 0:
            raise ConfigError(f"link delay {self.delay_s} s and jitter {self.jitter_s} s must be >= 0")

    def applies(self, peer: str) -> bool:
        return not self.peers or peer in self.peers

    def write(self, path: Path) -> None:
        """Replace the control file atomically (the proxy never reads half a shape)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: Path) -> LinkShape:
        """The shape in `path`; no file (or an unreadable one) is no delay."""
        try:
            raw = json.loads(path.read_text())
            return cls(float(raw["delay_s"]), float(raw["jitter_s"]), tuple(raw["peers"]))
        except (OSError, ValueError, KeyError, TypeError):
            return cls()


def due_time(now: float, previous: float, shape: LinkShape, rng: random.Random) -> float:
    """When a chunk read at `now` is passed on: after its delay, and not before `previous`."""
    jitter = rng.uniform(-shape.jitter_s, shape.jitter_s) if shape.jitter_s else 0.0
    return max(previous, now + max(0.0, shape.delay_s + jitter))


class LinkProxy:
    """Forwards connections on `listen` to `upstream`, shaped by the current `shape`."""

    def __init__(self, upstream: tuple[str, int], control: Path, seed: int = 0) -> None:
        self.upstream = upstream
        self.control = control
        self.shape = LinkShape.read(control)
        self._rng = random.Random(seed)

    async def follow_control(self) -> None:
        """Re-read the control file whenever it changes."""
        seen = None
        while True:
            with contextlib.suppress(OSError):
                mtime = self.control.stat().st_mtime_ns
                if mtime != seen:
                    seen, self.shape = mtime, LinkShape.read(self.control)
            await asyncio.sleep(CONTROL_POLL_S)

    async def handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        peer = str(c_writer.get_extra_info("peername")[0])
        try:
            u_reader, u_writer = await asyncio.wait_for(asyncio.open_connection(*self.upstream),
                                                        CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError):
            c_writer.close()
            return

        def shaped() -> LinkShape:
            return self.shape if self.shape.applies(peer) else LinkShape()

        pipes = [asyncio.ensure_future(_pipe(c_reader, u_writer, shaped, self._rng)),
                 asyncio.ensure_future(_pipe(u_reader, c_writer, shaped, self._rng))]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:   # either side closing or failing ends the connection, like a cable
            for task in pipes:
                task.cancel()
            for w in (c_writer, u_writer):
                w.close()
            await asyncio.gather(*pipes, return_exceptions=True)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                shape: Callable[[], LinkShape], rng: random.Random) -> None:
    """Copy one direction, each chunk held until its due time."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUE_CHUNKS)

    async def pump() -> None:
        due = 0.0
        while data := await reader.read(CHUNK):
            due = due_time(loop.time(), due, shape(), rng)
            await queue.put((due, data))
        await queue.put((0.0, b""))

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                return
            await asyncio.sleep(max(0.0, due - loop.time()))
            writer.write(data)
            await writer.drain()

    tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(deliver())]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()


async def serve(listen: tuple[str, int], proxy: LinkProxy) -> None:
    server = await asyncio.start_server(proxy.handle, *listen)
    async with server:
        await asyncio.gather(server.serve_forever(), proxy.follow_control())


def parse_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected IP:PORT, not {text!r}")
    return host, int(port)


def proxy_parser(prog: str) -> argparse.ArgumentParser:
    """The command line every fault proxy of the harness takes: `--listen`, `--upstream`,
    `--control`, `--seed` (a proxy may add its own)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--listen", type=parse_address, required=True)
    parser.add_argument("--upstream", type=parse_address, required=True)
    parser.add_argument("--control", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = proxy_parser("python -m memq.chaos.linkproxy").parse_args(argv)
    asyncio.run(serve(args.listen, LinkProxy(args.upstream, args.control, args.seed)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

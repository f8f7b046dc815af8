"""The link proxy delays a TCP stream (what `tc netem delay` would), keeps its order, changes
shape on established connections, and spares clients not in `peers`."""

from __future__ import annotations

import random
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memq.chaos.linkproxy import LinkShape, due_time
from memq.devcluster.process import free_port
from memq.errors import ConfigError
from tests.support.waiting import wait_for


def test_due_times_keep_stream_order_and_stay_within_jitter() -> None:
    rng, shape = random.Random(1), LinkShape(0.2, 0.15)
    due, dues = 0.0, []
    for i in range(200):
        due = due_time(i * 0.01, due, shape, rng)
        dues.append(due)
        assert i * 0.01 + 0.05 - 1e-9 <= due
    assert dues == sorted(dues)
    assert due_time(5.0, 1.0, LinkShape(), rng) == 5.0


def test_shape_file_round_trip_and_bad_values(tmp_path: Path) -> None:
    path = tmp_path / "link.json"
    assert LinkShape.read(path) == LinkShape()          # no file: no delay
    LinkShape(0.3, 0.1, ("10.0.0.2",)).write(path)
    got = LinkShape.read(path)
    assert got == LinkShape(0.3, 0.1, ("10.0.0.2",))
    assert got.applies("10.0.0.2") and not got.applies("10.0.0.3") and LinkShape().applies("10.0.0.3")
    with pytest.raises(ConfigError, match="jitter -1"):
        LinkShape(0.1, -1)


class _Echo(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[socket.socket, Path]]:
    """A connection to an echo server through a link proxy process, and its control file."""
    echo = _Echo(("127.0.0.1", 0), _EchoHandler)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    port, control = free_port(), tmp_path / "link.json"
    proc = subprocess.Popen([sys.executable, "-m", "memq.chaos.linkproxy", "--listen", f"127.0.0.1:{port}",
                             "--upstream", f"127.0.0.1:{echo.server_address[1]}", "--control", str(control)])
    try:
        wait_for(lambda: proc.poll() is None and _connects(port), 20, "the link proxy to listen")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            yield conn, control
    finally:
        proc.kill()
        proc.wait(10)
        echo.shutdown()
        echo.server_close()


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _round_trip(conn: socket.socket, payload: bytes) -> tuple[bytes, float]:
    start = time.monotonic()
    conn.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += conn.recv(65536)
    return got, time.monotonic() - start


def test_delay_applies_to_an_established_connection_in_both_directions(
        proxied: tuple[socket.socket, Path]) -> None:
    conn, control = proxied
    assert _round_trip(conn, b"hello")[0] == b"hello"
    LinkShape(1.0, 0.0, ("10.9.9.9",)).write(control)          # another client's link
    time.sleep(0.5)                                            # the proxy polls its control file
    got, spared = _round_trip(conn, b"spared")
    assert got == b"spared" and spared < 1.0
    LinkShape(0.5, 0.2).write(control)
    time.sleep(0.5)
    payload = bytes(range(256)) * 2000                         # many chunks, each with its own jitter
    got, took = _round_trip(conn, payload)
    assert got == payload                                      # in order, nothing lost
    assert took >= 2 * 0.3                                     # delayed each way, at least delay - jitter

"""The producer's WebSocket to one broker: many requests in flight, acks matched by id.

Small frames handed over in the same turn of the event loop go out as one bundle when the
broker reads bundles (it chose `BUNDLE_SUBPROTOCOL`): a producer of a hundred small topics
seals many one-record Messages at once, and a frame each cost both sides more than the
Messages themselves.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from typing import Callable

import aiohttp
from aiohttp import WSCloseCode

from memq.errors import BrokerUnavailableError, ProtocolError
from memq.format.wire import BUNDLE_ENTRY_BYTES, BUNDLE_HEAD_BYTES, BUNDLE_SUBPROTOCOL, Ack, decode_acks, encode_bundle

from ._auth import NO_AUTH, BrokerAuth
from ._reasons import reason

log = logging.getLogger(__name__)

# Socket send buffer for produce connections. A frame is up to max_message_bytes (1 MiB); with
# the default (autotuned from 16 KiB) send() takes part of it and asyncio copies the rest into
# its bytearray buffer, reallocating as it drains: that copying was over half the producer's CPU
# at 64 KiB values. A buffer larger than a frame lets send() take the whole frame in one go.
SEND_BUFFER_BYTES = 4 * 1024 * 1024

BUNDLE_BYTES = 256 * 1024        # a bundle stops taking frames at this size (or the broker's frame limit)
BUNDLE_FRAME_BYTES = 16 * 1024   # larger frames go alone: bundling them would only copy them


@dataclass(slots=True)
class _Bundle:
    """Frames waiting to go out together; `sent` tells those who joined how the write went."""

    frames: list[bytes | bytearray]
    nbytes: int
    sent: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class BrokerConnection:
    """Frames go out with `send`; a reader task hands every ack to `on_ack`, and calls
    `on_lost` once when the connection ends, so the producer can retry what was in flight."""

    def __init__(self, url: str, session: aiohttp.ClientSession, *, on_ack: Callable[[Ack], None],
                 on_lost: Callable[[BrokerConnection, str], None], timeout_s: float, max_frame_bytes: int,
                 auth: BrokerAuth = NO_AUTH, broker_frame_limit: int = 0) -> None:
        self.url = url
        self._session = session
        self._on_ack = on_ack
        self._on_lost = on_lost
        self._timeout_s = timeout_s
        self._max_frame_bytes = max_frame_bytes
        self._auth = auth
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._send_lock = asyncio.Lock()
        limit = broker_frame_limit or BUNDLE_BYTES
        self._bundle_bytes = min(BUNDLE_BYTES, limit - BUNDLE_FRAME_BYTES)   # a bundle stays under the limit
        self._bundling = False   # the broker reads bundles
        self._filling: _Bundle | None = None
        self.closed = False
        self.too_large = False

    async def connect(self) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                self._ws = await self._session.ws_connect(
                    self.url.rstrip("/") + "/v1/produce", heartbeat=30.0, compress=0,
                    max_msg_size=self._max_frame_bytes, protocols=(BUNDLE_SUBPROTOCOL,))
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            self.closed = True
            raise self._auth.failure(self.url, e) from None
        self._bundling = self._ws.protocol == BUNDLE_SUBPROTOCOL and self._bundle_bytes > 0
        _widen_send_buffer(self._ws)
        self._reader = asyncio.create_task(self._read(), name=f"acks-{self.url}")

    async def send(self, frame: bytes | bytearray) -> None:
        """Write one frame; waits (bounded) while the broker pushes back.

        One frame at a time: aiohttp writes a frame into the transport before it waits for the
        transport to drain, so concurrent senders would pile every in-flight frame into
        asyncio's write buffer (tens of MiB), and each append and partial send then copied that
        whole bytearray again (quadratic; most of the producer's CPU at 64 KiB values). Waiters
        queue here without a deadline; the sender ahead of them has one, and if it fails the
        connection is closed and they fail at once. A small frame joins the bundle being
        filled, or starts one and lets the rest of this turn of the event loop join it.
        """
        if not self._bundling or len(frame) > BUNDLE_FRAME_BYTES:
            if self._filling is not None:   # the bundle's frames were handed over first: they go first
                self._filling = None
                await asyncio.sleep(0)
            async with self._send_lock:
                await self._send_locked(self._open_ws(), frame)
            return
        bundle = self._filling
        if bundle is not None:
            bundle.frames.append(frame)
            bundle.nbytes += len(frame) + BUNDLE_ENTRY_BYTES
            if bundle.nbytes >= self._bundle_bytes:
                self._filling = None
            await asyncio.shield(bundle.sent)
            return
        bundle = self._filling = _Bundle([frame], BUNDLE_HEAD_BYTES + BUNDLE_ENTRY_BYTES + len(frame))
        try:
            await asyncio.sleep(0)   # Messages sealed in this turn join
            async with self._send_lock:
                if self._filling is bundle:
                    self._filling = None
                frames = bundle.frames
                await self._send_locked(self._open_ws(), frames[0] if len(frames) == 1 else encode_bundle(frames))
        except BaseException as e:
            if self._filling is bundle:
                self._filling = None
            if len(bundle.frames) > 1:   # those who joined fail as this sender does
                bundle.sent.set_exception(e if isinstance(e, BrokerUnavailableError) else BrokerUnavailableError(
                    f"writing to broker {self.url} was interrupted: {e!r}"))
            raise
        bundle.sent.set_result(None)

    def _open_ws(self) -> aiohttp.ClientWebSocketResponse:
        ws = self._ws
        if ws is None or self.closed or ws.closed:
            raise BrokerUnavailableError(f"produce connection to {self.url} is closed")
        return ws

    async def _send_locked(self, ws: aiohttp.ClientWebSocketResponse, frame: bytes | bytearray) -> None:
        try:
            async with asyncio.timeout(self._timeout_s):
                await ws.send_bytes(frame)   # type: ignore[arg-type]  # any buffer works; bytes() would copy it
        except (aiohttp.ClientError, ConnectionError, RuntimeError) as e:
            self._lost(f"write failed: {e!r}")
            raise BrokerUnavailableError(f"writing to broker {self.url} failed: {reason(e)}") from None
        except TimeoutError:
            self._lost(f"write did not finish within {self._timeout_s:g}s")
            raise BrokerUnavailableError(f"writing to {self.url} timed out after {self._timeout_s:g}s") from None

    async def _read(self) -> None:
        assert self._ws is not None
        why = "closed by broker"
        try:
            async for msg in self._ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    for ack in decode_acks(msg.data):
                        self._on_ack(ack)
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    why = f"connection to {self.url} lost: {self._ws.exception()}"
                    break
            if self._ws.close_code == WSCloseCode.MESSAGE_TOO_BIG:
                self.too_large = True
                why = "closed by broker: a frame was over its broker.max_frame_bytes (WebSocket code 1009)"
            elif self._ws.close_code is not None and self._ws.close_code != 1000:
                why = f"closed by broker with code {self._ws.close_code}"
        except ProtocolError as e:
            why = str(e)
        except (aiohttp.ClientError, ConnectionError) as e:
            why = f"connection to {self.url} lost: {reason(e)}"
        self._lost(why)

    def _lost(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        log.info("produce connection to %s lost: %s", self.url, why)
        if self._ws is not None and not self._ws.closed:
            asyncio.get_running_loop().create_task(self._ws.close())
        self._on_lost(self, why)

    async def close(self) -> None:
        self.closed = True
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


def _widen_send_buffer(ws: aiohttp.ClientWebSocketResponse) -> None:
    sock = ws.get_extra_info("socket")
    if sock is not None:   # the kernel caps it at net.core.wmem_max
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)

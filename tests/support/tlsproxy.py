"""A TLS front for a plain-HTTP server in tests: an S3 endpoint behind a private CA (trustme).

It terminates TLS on 127.0.0.1 and relays the bytes to the upstream unchanged, noting the
access key id of every SigV4 `Authorization` header it relays, so a test can see which
credentials a client signed with.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
from urllib.parse import urlsplit

import trustme

_CREDENTIAL = re.compile(rb"Credential=([A-Za-z0-9]+)/")


class TlsProxy:
    """`with TlsProxy(upstream_url, ca) as proxy:` ... point the client at `proxy.url` and trust `ca`."""

    def __init__(self, upstream_url: str, ca: trustme.CA) -> None:
        parts = urlsplit(upstream_url)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("127.0.0.1", "localhost").configure_cert(self._context)
        self.key_ids: list[str] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tlsproxy", daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self._context)
        self.url = f"https://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer, note=True), self._pipe(up_reader, writer, note=False),
                             return_exceptions=True)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, note: bool) -> None:
        try:
            while data := await reader.read(65536):
                if note:
                    self.key_ids += [m.decode() for m in _CREDENTIAL.findall(data)]
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

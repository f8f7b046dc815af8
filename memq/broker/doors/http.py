"""The broker's HTTP door: `/v1/produce` (WebSocket upgrade), `/v1/metadata[?topic=NAME...]`,
`/v1/read` (parts for memq's Consumer, `doors.read`),
`/v1/offsets` (dense offsets for readers outside a broker, `doors.offsets`), `/healthz`, `/metrics`.

Behind the Guard's middleware (memq.broker.guard) when security is on. The produce
connections it opened are its own: `shutdown` lets their queued acks go out, then closes them.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from memq.format.wire import BUNDLE_SUBPROTOCOL

from ..guard import PRINCIPAL_KEY
from ..seam import BrokerCore
from .offsets import OffsetsDoor
from .read import ReadDoor
from .websocket import ProduceConnection


class HttpDoor:
    def __init__(self, core: BrokerCore, app: web.Application) -> None:
        self._core = core
        self._connections: set[ProduceConnection] = set()
        self.starting: str | None = None   # why /healthz is not 200 yet (None: ready)
        app.add_routes([web.get("/v1/produce", self._produce), web.get("/v1/metadata", self._metadata),
                        web.get("/healthz", self._healthz), web.get("/health", self._healthz),
                        web.get("/metrics", self._prometheus)])
        ReadDoor(core, app)
        OffsetsDoor(core, app)

    async def shutdown(self, timeout_s: float) -> None:
        """Let each produce connection's queued acks go out (within `timeout_s`), then close it."""
        await asyncio.gather(*(c.shutdown(timeout_s) for c in list(self._connections)))

    async def _produce(self, request: web.Request) -> web.StreamResponse:
        core = self._core
        if core.draining:
            raise web.HTTPServiceUnavailable(text=f"broker {core.broker_id} is shutting down")
        bc = core.config.broker
        ws = web.WebSocketResponse(max_msg_size=bc.max_frame_bytes, heartbeat=30.0, compress=False,
                                   protocols=(BUNDLE_SUBPROTOCOL,))
        await ws.prepare(request)
        session = core.guard.open_session(request, lambda why: conn.revoke(why))
        conn = ProduceConnection(ws, core, max_pending_acks=bc.max_pending_acks,
                                 write_timeout_s=bc.ack_write_timeout_ms / 1000,
                                 principal=request.get(PRINCIPAL_KEY), session=session)
        self._connections.add(conn)
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)
            if session is not None:
                core.guard.end_session(session)
        return ws

    async def _metadata(self, request: web.Request) -> web.Response:
        """The cluster as the principal may see it; each `?topic=` it may not describe is refused."""
        md = self._core.guard.visible(request.get(PRINCIPAL_KEY), self._core.metadata(),
                                      request.query.getall("topic", []))
        return web.json_response(md.to_dict())

    async def _healthz(self, request: web.Request) -> web.Response:
        """200 while healthy; 503 with the reason while starting, draining or unable to publish
        notifications."""
        core = self._core
        why = self.starting or core.health()
        status = ("ok" if why is None else "starting" if self.starting else "draining" if core.draining
                  else "unhealthy")
        body = {"status": status, "broker_id": core.broker_id, "topics": core.hosted()}
        if why is not None:
            body["reason"] = why
        return web.json_response(body, status=200 if why is None else 503)

    async def _prometheus(self, request: web.Request) -> web.Response:
        # in a thread: with a thousand topics rendering takes ~1 s, which on the event loop
        # would stall every produce connection for as long
        body = await asyncio.to_thread(generate_latest, self._core.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

"""One producer's `/v1/produce` WebSocket: read Message frames, write batched acks.

A frame holds one request, or a bundle of them (memq.format.wire): a bundle's requests are
handled in order, exactly as if each had come in its own frame.

Frames are handled one at a time. A request for a topic with no free batch slot waits aside,
behind that topic's earlier waiting requests and in order, while the connection goes on with
other topics (one busy topic, e.g. waiting for a slow notification, stalled every topic of the
producer's connection: seconds of ack latency for all). Up to `MAX_PARKED_BYTES` of Messages
wait so; then the connection stops reading and TCP pushes back on the producer. A request
still waiting when its connection closes is dropped unanswered (a producer waiting for its ack
sends it again). The same holds a client over its byte-rate
quota (memq.security.quota): its request is accepted, its ack carries the throttle time, and
the connection is not read for that long. Acks go through a bounded queue drained by
one writer task, several per frame. Every bad frame gets an error ack naming the problem; a
client that does not read its acks (queue full, or a write that does not finish within
`write_timeout_s`) is closed cleanly, and other connections are not affected.

A transaction's calls and its Messages (version 4 requests) are carried out aside, in tasks
(`websocket_txn`: a ZooKeeper write, a PUT, a commit's publish round take a while), at most
`MAX_TXN_TASKS` at a time per connection; beyond that the connection stops reading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from functools import partial

from aiohttp import WebSocketError, WSCloseCode, WSMsgType, web
from prometheus_client import Histogram

from memq.errors import FormatError, MemqError, ProtocolError
from memq.format import decode_message, encode_message, verify_message
from memq.format.message import MessageHeader
from memq.format.txn_wire import decode_txn_call, is_txn_call, peek_call_id
from memq.format.wire import (NO_REQUEST_ID, Ack, AckCode, AckLevel, ProduceRequest, RequestFlag, decode_request,
                              encode_acks, is_bundle, peek_request_id, split_bundle)
from memq.schema.check import checked, dead_letters

from ..admission import Refusal, Ticket
from ..guard import Session
from ..seam import BrokerCore
from .websocket_txn import answer_call, store_message

log = logging.getLogger(__name__)

MAX_ACKS_PER_FRAME = 4096
MAX_PARKED_BYTES = 1024 * 1024   # Message bytes waiting for a batch slot, per connection (~ one large Message)
MAX_TXN_TASKS = 32               # transaction calls and Messages under way, per connection


class ProduceConnection:
    def __init__(self, ws: web.WebSocketResponse, core: BrokerCore, *, max_pending_acks: int,
                 write_timeout_s: float, principal: str | None = None, session: Session | None = None) -> None:
        """`session`: the guard's record of this connection (security on), closed by `revoke`."""
        self._ws = ws
        self._principal = principal   # None: security off
        self._session = session
        self._core = core
        self._metrics = core.metrics
        self._max_pending = max_pending_acks
        self._write_timeout_s = write_timeout_s
        # (ack, the "ack" stage histogram of its topic or None for a request refused before
        # reaching a topic's processor, when it was queued)
        self._pending: deque[tuple[Ack, Histogram | None, float]] = deque()
        self._wakeup = asyncio.Event()
        self._closed = False
        # topic -> its requests waiting for a batch slot, in order: (bytes, the append to run)
        self._parked: dict[str, deque[tuple[int, Callable[[], Awaitable[None]]]]] = {}
        self._parked_bytes = 0
        self._unparked = asyncio.Event()
        self._drainers: set[asyncio.Task[None]] = set()
        self._txn_slots = asyncio.Semaphore(MAX_TXN_TASKS)
        # not cancelled when the connection ends: a commit half done is finished, not cut short
        self._aside_tasks: set[asyncio.Task[None]] = set()

    @property
    def _peer(self) -> str:
        peer = self._ws.get_extra_info("peername") if self._ws.prepared else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(self._principal or "?")

    async def run(self) -> None:
        writer = asyncio.create_task(self._write_acks(), name="ack-writer")
        self._metrics.connections.inc()
        try:
            async for msg in self._ws:
                if self._closed:
                    break
                if msg.type == WSMsgType.BINARY:
                    await self._handle(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    self._reject(NO_REQUEST_ID, AckCode.PROTOCOL,
                                 "text frame: the produce protocol uses binary frames only")
                elif msg.type == WSMsgType.ERROR:
                    e = self._ws.exception()
                    if isinstance(e, WebSocketError) and e.code == WSCloseCode.MESSAGE_TOO_BIG:
                        log.warning("closed a produce connection (1009): %s (broker.max_frame_bytes=%d)",
                                    e, self._core.config.broker.max_frame_bytes)
                    else:
                        log.info("produce connection error: %s", e)
                    break
            # let queued acks (e.g. from a final batch) go out before closing
            if not self._closed and not self._ws.closed:
                self._wakeup.set()
        finally:
            self._metrics.connections.dec()
            self._closed = True
            self._wakeup.set()
            for task in list(self._drainers):
                task.cancel()
            await asyncio.gather(*self._drainers, return_exceptions=True)
            await writer
            await self._ws.close()

    async def shutdown(self, timeout_s: float) -> None:
        """Broker shutdown: let queued acks go out (up to `timeout_s`), then close GOING_AWAY."""
        deadline = time.monotonic() + timeout_s
        while self._pending and not self._ws.closed and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self._closed = True
        self._wakeup.set()
        await self._ws.close(code=WSCloseCode.GOING_AWAY, message=b"broker shutting down")

    def _reply(self, ack: Ack, stage: Histogram | None, throttle_ms: int = 0) -> None:
        """Queue `ack` for the writer task."""
        if self._closed:
            return
        if throttle_ms:
            ack = dataclasses.replace(ack, throttle_ms=throttle_ms)
        if len(self._pending) >= self._max_pending:
            self._close_slow(f"client did not read its acks ({self._max_pending} pending)")
            return
        self._pending.append((ack, stage, time.monotonic()))
        self._wakeup.set()

    def _reject(self, request_id: int, code: AckCode, why: str, brokers: tuple[str, ...] = ()) -> None:
        self._metrics.rejected.labels(str(code)).inc()
        self._reply(Ack(request_id, False, code, why, brokers=brokers), None)


    async def _handle(self, data: bytes) -> None:
        if not is_bundle(data):
            await self._handle_request(data)
            return
        try:
            requests = split_bundle(data)
        except ProtocolError as e:
            self._reject(NO_REQUEST_ID, AckCode.PROTOCOL, str(e))
            return
        self._metrics.bundles.inc()
        self._metrics.bundled_requests.inc(len(requests))
        for request in requests:
            if self._closed:
                return
            await self._handle_request(request)

    async def _handle_request(self, data: bytes | memoryview) -> None:
        if is_txn_call(data):
            await self._txn_call(data)
            return
        try:
            req = decode_request(data)
        except ProtocolError as e:
            self._reject(peek_request_id(data), AckCode.PROTOCOL, str(e))
            return
        topic = req.topic
        size = len(req.message)
        admitted = self._core.admission.admit(self._principal, topic, size, req.partition)
        if isinstance(admitted, Refusal):
            self._refuse(req, admitted.code, admitted.why, admitted.brokers)
            return
        if self._session is not None:
            self._session.produced(topic)
        try:
            header = verify_message(req.message)
        except FormatError as e:
            self._refuse(req, AckCode.CORRUPT, f"request {req.request_id}: {e}")
            return
        if checked(admitted.config):
            passed = await self._records_pass(req, admitted, header)
            if passed is None:
                return
            req, header = passed
        throttle_s = self._core.admission.charge(self._principal, ((topic, size),))
        throttle_ms = round(throttle_s * 1000)
        if req.transactional_id:
            await self._aside(store_message(self._core, admitted, req, header, self._peer), throttle_ms)
        elif topic in self._parked or not admitted.can_append_now():
            await self._park(topic, size, partial(self._append, admitted, req, header, throttle_ms))
        else:
            await self._append(admitted, req, header, throttle_ms)
        if throttle_s:
            await asyncio.sleep(throttle_s)   # read nothing more from this client meanwhile

    async def _records_pass(self, req: ProduceRequest, ticket: Ticket,
                            header: MessageHeader) -> tuple[ProduceRequest, MessageHeader] | None:
        """A topic with schema checks: the Message's records decoded and checked by the admission
        path. The request to store (under `dlq`, its failing records taken out once they are in
        the dead-letter topic), or None when it was answered: refused (`reject`, or a dead-letter
        topic that cannot take them: INVALID_RECORD naming the record) or all dead-lettered (OK)."""
        try:
            _, records = decode_message(req.message)
        except FormatError as e:
            self._refuse(req, AckCode.CORRUPT, f"request {req.request_id}: {e}")
            return None
        try:
            failures = await self._core.admission.check_records(ticket, records)
        except MemqError as e:   # the registry's store cannot answer (ZooKeeper away): retriable
            self._refuse(req, AckCode.STORAGE, f"request {req.request_id}: schema checks: {e}")
            return None
        action = ticket.config.schema_validation_action
        if not failures or action == "warn":
            return req, header
        extra = ""
        if action == "dlq":
            # the Message's own ids: a retry is framed the same, so dedup drops it in both topics
            letters = encode_message(dead_letters(records, failures, req.topic, req.partition),
                                     producer_id=header.producer_id, epoch=header.epoch, sequence=header.sequence)
            why = await self._core.admission.dead_letter(self._principal, req.topic, memoryview(letters),
                                                         verify_message(letters), req.request_id)
            if why is None:
                failed = {f.index for f in failures}
                keep = [r for i, r in enumerate(records) if i not in failed]
                if not keep:
                    if req.ack is not AckLevel.NONE:
                        self._reply(Ack(req.request_id, True), None)
                    return None
                rest = memoryview(encode_message(keep, producer_id=header.producer_id, epoch=header.epoch,
                                                 sequence=header.sequence))
                return dataclasses.replace(req, message=rest), verify_message(rest)
            extra = f"; the dead-letter topic cannot take them: {why}"
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        self._refuse(req, AckCode.INVALID_RECORD, f"request {req.request_id}: {len(failures)} of {len(records)} "
                                                  f"records fail the schema checks: {failures[0]}{more}{extra}")
        return None

    async def _txn_call(self, data: bytes | memoryview) -> None:
        try:
            call = decode_txn_call(data)
        except ProtocolError as e:
            self._reject(peek_call_id(data), AckCode.PROTOCOL, str(e))
            return
        await self._aside(answer_call(self._core, self._principal, self._peer, call))

    async def _aside(self, answer: Awaitable[Ack], throttle_ms: int = 0) -> None:
        """Run `answer` (a transaction's call or Message) in a task of its own and queue its ack;
        waits while MAX_TXN_TASKS are under way."""
        await self._txn_slots.acquire()

        async def run() -> None:
            try:
                self._reply(await answer, None, throttle_ms)
            finally:
                self._txn_slots.release()
        task = asyncio.get_running_loop().create_task(run(), name="txn")
        self._aside_tasks.add(task)
        task.add_done_callback(self._aside_tasks.discard)

    def _refuse(self, req: ProduceRequest, code: AckCode, why: str, brokers: tuple[str, ...] = ()) -> None:
        """A request refused before reaching a topic: an error ack, unless it asked for none."""
        if req.ack is AckLevel.NONE:
            return
        self._reject(req.request_id, code, why, brokers)

    async def _append(self, ticket: Ticket, req: ProduceRequest, header: MessageHeader, throttle_ms: int) -> None:
        if req.ack is AckLevel.NONE:
            reply = _ignore
        else:
            stage = ticket.ack_stage
            reply = partial(self._reply, stage=stage, throttle_ms=throttle_ms)
        await ticket.append(req.message, header, req.request_id, req.ack, reply, seal=req.flags is RequestFlag.SEAL)

    async def _park(self, topic: str, size: int, append: Callable[[], Awaitable[None]]) -> None:
        """Queue `append` behind `topic`'s waiting requests; waits only while the connection
        already holds MAX_PARKED_BYTES of waiting Messages."""
        while self._parked_bytes and self._parked_bytes + size > MAX_PARKED_BYTES:
            self._unparked.clear()
            await self._unparked.wait()
        queue = self._parked.get(topic)
        if queue is None:
            queue = self._parked[topic] = deque()
            task = asyncio.get_running_loop().create_task(self._drain(topic, queue), name=f"parked-{topic}")
            self._drainers.add(task)
            task.add_done_callback(self._drainers.discard)
        queue.append((size, append))
        self._parked_bytes += size

    async def _drain(self, topic: str, queue: deque[tuple[int, Callable[[], Awaitable[None]]]]) -> None:
        try:
            while queue:
                size, append = queue[0]
                try:
                    await append()
                finally:
                    queue.popleft()
                    self._parked_bytes -= size
                    self._unparked.set()
        finally:
            if self._parked.get(topic) is queue:
                del self._parked[topic]

    def _close_slow(self, why: str) -> None:
        if not self._closed:
            self._metrics.slow_clients.inc()
            self._close_now(WSCloseCode.TRY_AGAIN_LATER, why)

    def revoke(self, why: str) -> None:
        """Its credentials or rights no longer hold (the guard's session check): close at once,
        answering nothing more (a producer reconnecting is refused, and says why)."""
        self._close_now(WSCloseCode.POLICY_VIOLATION, why)

    def _close_now(self, code: WSCloseCode, why: str) -> None:
        if self._closed:
            return
        log.warning("closing produce connection: %s", why)
        self._closed = True
        self._pending.clear()
        self._wakeup.set()
        asyncio.get_running_loop().create_task(self._ws.close(code=code, message=why[:120].encode()))

    async def _write_acks(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending and not self._ws.closed:
                n = min(len(self._pending), MAX_ACKS_PER_FRAME)
                items = [self._pending.popleft() for _ in range(n)]
                try:
                    async with asyncio.timeout(self._write_timeout_s):
                        await self._ws.send_bytes(encode_acks([a for a, _, _ in items]))
                except TimeoutError:
                    self._close_slow(f"ack write did not finish within {self._write_timeout_s:g}s")
                    return
                except (ConnectionError, RuntimeError):
                    return   # the peer went away; nothing left to tell it
                # the ack stage: per frame and histogram, its oldest ack's wait (an observation
                # per ack was ~5% of a broker taking 10,000 small Messages a second)
                oldest: dict[Histogram, float] = {}
                for _, stage, t in items:
                    if stage is not None:
                        oldest.setdefault(stage, t)
                now = time.monotonic()
                for stage, t in oldest.items():
                    stage.observe(now - t)
            if self._closed:
                return


def _ignore(ack: Ack) -> None:
    """The reply of an ack=0 Message: the producer asked for no answer."""

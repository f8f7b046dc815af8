"""A transactional Producer's transaction: its phase, the topics it wrote, and its calls.

The Producer keeps its Messages' path (memq.client.sender; each Message of a transaction is
stored by its broker at once and published only at commit). This module holds what Kafka's
transaction manager holds: the phase (`TxnPhase`, which calls are legal when), the producer id
and epoch the coordinator gave (`init`: a new epoch fences every older producer of the
transactional id), the topics added to the open transaction (`enter`: once per topic, before the
first Message to it, as Kafka's AddPartitionsToTxn), a Consumer group's offsets to commit with
it, and `end` (commit or abort). Calls travel as memq.format.txn_wire frames on a connection of
their own to one broker (any: the transaction's state is shared in ZooKeeper; a broker that
answers NOT_HERE naming another sends the call there), retried with backoff while the
answer is retriable (the broker busy finishing the previous transaction, a lost connection).

A Message of the open transaction that fails makes the transaction abortable only (`failed`):
committing it would lose that Message, so `end(commit=True)` refuses and the application aborts.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from memq.errors import BrokerUnavailableError, ProduceError, ProducerFencedError, ProtocolError, TransactionError
from memq.format.txn_wire import TxnCall, TxnOp, encode_txn_call
from memq.format.wire import RETRIABLE_CODES, Ack, AckCode

from ._singleflight import SingleFlight

log = logging.getLogger(__name__)

#: Opens a call connection to a broker URL handing acks to `on_ack` and calling `on_lost(conn, why)`
#: (memq.client.sender.Sender.open fits).
Opener = Callable[[str, Callable[[Ack], None], Callable[[Any, str], None]], Awaitable[Any]]

_MAX_BACKOFF_S = 2.0


class TxnPhase(enum.Enum):
    NEW = "new"              # no producer id yet: init first
    READY = "ready"          # no transaction open: begin
    OPEN = "open"            # sends, offsets, commit or abort
    ABORTABLE = "abortable"  # a Message failed, or a commit did: abort only
    ENDING = "ending"        # commit or abort under way
    FENCED = "fenced"        # a newer producer of the id took over: nothing more


class Transaction:
    """`brokers`: the URLs calls may go to, in order of preference. `timeout_s`: each call's
    answer; `deadline_s`: a call's retries in all."""

    def __init__(self, transactional_id: str, *, timeout_ms: int, brokers: list[str], open_conn: Opener,
                 timeout_s: float, deadline_s: float, backoff_s: float) -> None:
        if not transactional_id:
            raise TransactionError("a transactional id must not be empty")
        self.transactional_id = transactional_id
        self.timeout_ms = timeout_ms
        self.producer_id = -1
        self.epoch = -1
        self.phase = TxnPhase.NEW
        self._brokers = brokers
        self._open_conn = open_conn
        self._timeout_s = timeout_s
        self._deadline_s = deadline_s
        self._backoff_s = backoff_s
        self._added: set[str] = set()
        self._with_offsets = False   # the open transaction carries a Consumer group's offsets
        self._adding: SingleFlight[str, None] = SingleFlight()
        self._failure = ""
        self._conn: Any = None
        self._url = ""
        self._waiting: dict[int, asyncio.Future[Ack]] = {}
        self._next_id = 1

    # --- the phases --------------------------------------------------------------------------

    async def init(self) -> tuple[int, int]:
        """Get the producer id and a new epoch (fencing older producers of the id)."""
        if self.phase not in (TxnPhase.NEW, TxnPhase.READY):
            raise TransactionError(f"transactional id {self.transactional_id}: init while {self.phase.value}")
        ack = await self._call(TxnOp.INIT, timeout_ms=self.timeout_ms)
        if ack.producer_id < 0:
            raise ProtocolError(f"the broker answered the init of {self.transactional_id} without a producer id")
        self.producer_id, self.epoch = ack.producer_id, ack.epoch
        self.phase = TxnPhase.READY
        return self.producer_id, self.epoch

    def begin(self) -> None:
        self._expect(TxnPhase.READY, "begin")
        self.phase = TxnPhase.OPEN
        self._added.clear()
        self._with_offsets = False
        self._failure = ""

    async def enter(self, topic: str) -> None:
        """A send to `topic`: legal only in an open transaction; adds the topic once."""
        self._expect(TxnPhase.OPEN, f"send to {topic}")
        if topic in self._added:
            return
        await self._adding.run(topic, lambda: self._add(topic))

    async def _add(self, topic: str) -> None:
        if topic not in self._added:
            await self._call(TxnOp.ADD, topics=(topic,))
            self._added.add(topic)

    def failed(self, error: BaseException) -> None:
        """A Message of the open transaction failed: it can only abort now."""
        if isinstance(error, ProducerFencedError):
            self.phase = TxnPhase.FENCED
        elif self.phase in (TxnPhase.OPEN, TxnPhase.ENDING):
            self.phase = TxnPhase.ABORTABLE
        self._failure = self._failure or str(error)

    async def offsets(self, group: str, offsets: Mapping[str, Mapping[int, int]]) -> None:
        """Commit a memq Consumer group's next offsets (`Consumer.position()`) per topic and read partition
        with the transaction."""
        self._expect(TxnPhase.OPEN, "send_offsets")
        for topic, parts in offsets.items():
            if parts:
                self._with_offsets = True
                await self._call(TxnOp.OFFSETS, group=group, topic=topic, offsets=tuple(sorted(parts.items())))

    def ending(self, commit: bool) -> None:
        """Check that `end(commit)` may start, and stop sends meanwhile."""
        if self.phase is TxnPhase.ABORTABLE and commit:
            raise TransactionError(f"transaction {self.transactional_id} cannot commit: {self._failure}; abort it")
        if self.phase is not TxnPhase.ABORTABLE:
            self._expect(TxnPhase.OPEN, "commit" if commit else "abort")
        self.phase = TxnPhase.ENDING

    async def end(self, commit: bool) -> None:
        """Commit or abort (after `ending` and the Producer's flush). A Message that failed in
        between makes a commit refuse (abort then)."""
        if commit and self._failure:
            self.phase = TxnPhase.ABORTABLE
            raise TransactionError(f"transaction {self.transactional_id} cannot commit: {self._failure}; abort it")
        if not self._added and not self._with_offsets:   # nothing reached a broker: as librdkafka, no EndTxn
            self.phase = TxnPhase.READY
            return
        try:
            await self._call(TxnOp.END, commit=commit)
        except ProducerFencedError:
            raise
        except BaseException:
            self.phase = TxnPhase.ABORTABLE
            raise
        self.phase = TxnPhase.READY

    def _expect(self, phase: TxnPhase, what: str) -> None:
        if self.phase is TxnPhase.FENCED:
            raise ProducerFencedError(f"transactional id {self.transactional_id}: {what} after this producer "
                                      f"was fenced: {self._failure}")
        if self.phase is not phase:
            hint = {TxnPhase.NEW: "begin() first", TxnPhase.READY: "begin() first",
                    TxnPhase.OPEN: "commit() or abort() first", TxnPhase.ABORTABLE: "abort() first",
                    TxnPhase.ENDING: "wait for the commit or abort under way"}[self.phase]
            raise TransactionError(f"transactional id {self.transactional_id}: {what} while the transaction is "
                                   f"{self.phase.value}: {hint}")

    # --- calls -------------------------------------------------------------------------------

    async def _call(self, op: TxnOp, **fields: Any) -> Ack:
        """One call until answered: retriable answers and lost connections are retried with
        backoff within `deadline_s`; an error answer raises its error."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline_s
        attempt = 0
        last = ""
        while True:
            attempt += 1
            try:
                ack = await self._once(op, fields)
            except BrokerUnavailableError as e:
                last = str(e)
                self._url = self._other_broker()
            else:
                if ack.ok:
                    return ack
                last = f"broker {self._url} answered {ack.code}: {ack.error}"
                if ack.code == AckCode.NOT_HERE and ack.brokers:
                    self._url = ack.brokers[0]
                    await self._drop()
                    if attempt == 1:
                        continue
                elif ack.code not in RETRIABLE_CODES:
                    raise self._error(op, ack)
            left = deadline - loop.time()
            if left <= 0:
                raise TransactionError(f"transaction {self.transactional_id}: {op} not answered within "
                                       f"{self._deadline_s:g}s: {last}")
            log.info("retrying %s of transaction %s: %s", op, self.transactional_id, last)
            await asyncio.sleep(min(self._backoff_s * 2 ** min(attempt, 8), _MAX_BACKOFF_S, left)
                                * (0.5 + random.random() / 2))

    async def _once(self, op: TxnOp, fields: dict[str, Any]) -> Ack:
        conn = await self._connection()
        rid = self._next_id
        self._next_id += 1
        call = TxnCall(rid, op, self.transactional_id, self.producer_id, self.epoch, **fields)
        answer: asyncio.Future[Ack] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = answer
        try:
            await conn.send(encode_txn_call(call))
            async with asyncio.timeout(self._timeout_s):
                return await answer
        except TimeoutError:
            await self._drop()
            raise BrokerUnavailableError(f"no answer to {op} from {self._url} within {self._timeout_s:g}s") from None
        finally:
            self._waiting.pop(rid, None)

    def _error(self, op: TxnOp, ack: Ack) -> ProduceError:
        why = f"transaction {self.transactional_id} {op}: {ack.error or ack.code}"
        if ack.code == AckCode.FENCED:
            self.phase = TxnPhase.FENCED
            self._failure = why
            return ProducerFencedError(why)
        return TransactionError(why)

    async def _connection(self) -> Any:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        self._url = self._url or self._brokers[0]
        self._conn = await self._open_conn(self._url, self._on_ack, self._on_lost)
        return self._conn

    def _other_broker(self) -> str:
        """After a broker failed a call: the next configured one (the same if it is the only one)."""
        if self._url in self._brokers:
            return self._brokers[(self._brokers.index(self._url) + 1) % len(self._brokers)]
        return self._brokers[0]

    def _on_ack(self, ack: Ack) -> None:
        answer = self._waiting.pop(ack.id, None)
        if answer is not None and not answer.done():
            answer.set_result(ack)

    def _on_lost(self, conn: Any, why: str) -> None:
        if conn is not self._conn:
            return
        self._conn = None
        for rid, answer in list(self._waiting.items()):
            if not answer.done():
                answer.set_exception(BrokerUnavailableError(f"call connection to {conn.url} lost: {why}"))
            self._waiting.pop(rid, None)

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def close(self) -> None:
        await self._drop()

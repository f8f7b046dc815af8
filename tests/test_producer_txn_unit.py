"""The transactional Producer against a scripted broker (no servers): which frames go out in which
order, retries of a busy coordinator, a redirect, fencing, a failed Message forcing an abort, and
audit reports held until the commit."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from memq.config import ProducerConfig
from memq.client.producer import Producer
from memq.errors import ProducerFencedError, TransactionError
from memq.format.message import decode_message_header
from memq.format.txn_wire import TxnCall, TxnOp, decode_txn_call, is_txn_call
from memq.format.wire import Ack, AckCode, ProduceRequest, decode_request
from tests.support.producer import FakeRouter

PID = 77


class TxnBroker:
    """Answers calls and Messages: `codes[op]` (or `codes["produce"]`) in turn, the last repeating;
    an init gets producer id PID and the next epoch."""

    def __init__(self, codes: dict[str, Sequence[AckCode]] | None = None, url: str = "http://fake") -> None:
        self.codes = codes or {}
        self.seen: list[TxnCall | ProduceRequest] = []
        self.urls: list[str] = []
        self.url = url
        self.epoch = -1
        self._counts: dict[str, int] = {}

    async def connect(self, url: str, on_ack: Callable[[Ack], None], on_lost: object) -> Conn:
        self.urls.append(url)
        return Conn(self, url, on_ack)

    def _code(self, what: str) -> AckCode:
        scripted = self.codes.get(what, [AckCode.OK])
        n = self._counts[what] = self._counts.get(what, 0) + 1
        return scripted[min(n, len(scripted)) - 1]

    def answer(self, frame: bytes | bytearray) -> Ack:
        data = bytes(frame)
        if is_txn_call(data):
            call = decode_txn_call(data)
            self.seen.append(call)
            code, rid = self._code(str(call.op)), call.request_id
            extra: dict[str, Any] = {}
            if call.op is TxnOp.INIT and code == AckCode.OK:
                self.epoch += 1
                extra = {"producer_id": PID, "epoch": self.epoch}
            if code == AckCode.NOT_HERE:
                extra = {"brokers": ("http://coordinator",)}
        else:
            req = decode_request(data)
            self.seen.append(req)
            code, rid, extra = self._code("produce"), req.request_id, {}
        return Ack(rid, code == AckCode.OK, code, "" if code == AckCode.OK else "scripted", **extra)

    def ops(self) -> list[str]:
        return [str(s.op) if isinstance(s, TxnCall) else f"produce:{s.topic}" for s in self.seen]


class Conn:
    """One connection to the scripted broker: its acks go to its own `on_ack`."""

    def __init__(self, broker: TxnBroker, url: str, on_ack: Callable[[Ack], None]) -> None:
        self.broker, self.url, self.on_ack = broker, url, on_ack
        self.closed = False
        self.too_large = False

    async def send(self, frame: bytes | bytearray) -> None:
        asyncio.get_running_loop().call_soon(self.on_ack, self.broker.answer(frame))

    async def close(self) -> None:
        self.closed = True


def producer(broker: TxnBroker, **kw: Any) -> Producer:
    pc = ProducerConfig(brokers="http://fake", linger_ms=1, retry_backoff_ms=1, delivery_timeout_ms=5000,
                        request_timeout_ms=1000)
    return Producer(pc, router=FakeRouter({"t": [broker.url], "u": [broker.url]}), connector=broker.connect,
                    transactional_id="tx", **kw)


class Audit:
    def __init__(self) -> None:
        self.sequences: list[int] = []

    def produced(self, *, topic: str, producer_id: int, epoch: int, sequence: int, count: int, digest: int,
                 created_ms: int) -> None:
        self.sequences.append(sequence)


async def test_a_transaction_inits_once_adds_each_topic_once_and_its_messages_carry_the_ids() -> None:
    broker = TxnBroker()
    async with producer(broker) as p:
        await p.begin()
        await (await p.send_many("t", [b"a", b"b"]))
        await (await p.send("t", b"c"))
        await (await p.send("u", b"d"))
        await p.commit()
        await p.begin()
        await (await p.send("t", b"e"))
        await p.abort()
    assert broker.ops() == ["init", "add", "produce:t", "produce:t", "add", "produce:u", "end",
                            "add", "produce:t", "end"]
    messages = [s for s in broker.seen if isinstance(s, ProduceRequest)]
    assert {s.transactional_id for s in messages} == {"tx"}
    assert {(h.producer_id, h.epoch) for h in (decode_message_header(s.message) for s in messages)} == {(PID, 0)}
    ends = [s for s in broker.seen if isinstance(s, TxnCall) and s.op is TxnOp.END]
    assert [e.commit for e in ends] == [True, False] and (ends[0].producer_id, ends[0].epoch) == (PID, 0)


async def test_a_busy_coordinator_is_asked_again_and_a_redirect_is_followed() -> None:
    broker = TxnBroker({"init": [AckCode.NOT_HERE, AckCode.OK], "end": [AckCode.TXN_BUSY, AckCode.TXN_BUSY,
                                                                       AckCode.OK]})
    async with producer(broker) as p:
        await p.begin()
        await (await p.send("t", b"x"))
        await p.commit()
    assert broker.ops().count("end") == 3 and broker.ops().count("init") == 2
    assert "http://coordinator" in broker.urls


async def test_fencing_ends_the_producer_for_transactions() -> None:
    broker = TxnBroker({"produce": [AckCode.FENCED]})
    async with producer(broker) as p:
        await p.begin()
        sent = await p.send("t", b"x")
        with pytest.raises(ProducerFencedError):
            await sent
        with pytest.raises(ProducerFencedError):
            await p.commit()
        with pytest.raises(ProducerFencedError):
            await p.begin()
    assert broker.ops().count("end") == 0


async def test_a_failed_message_makes_the_transaction_abort_only() -> None:
    broker = TxnBroker({"produce": [AckCode.CORRUPT, AckCode.OK]})
    audit = Audit()
    async with producer(broker, audit=audit) as p:
        await p.begin()
        failed, ok = await p.send("t", b"bad"), None
        with pytest.raises(Exception):
            await failed
        with pytest.raises(TransactionError, match="abort it"):
            await p.commit()
        await p.abort()
        assert audit.sequences == []                 # nothing of an aborted transaction was produced
        await p.begin()
        ok = await p.send("t", b"good")
        await ok
        assert audit.sequences == []                 # reported at the commit, not at the ack
        await p.commit()
        assert audit.sequences == [1]
    assert [e.commit for e in broker.seen if isinstance(e, TxnCall) and e.op is TxnOp.END] == [False, True]

"""The pure quota model (memq.security.quota) and the [quota] settings: which rate applies, and
that delaying a greedy client by the throttle time holds it to its rate (simulated clock); the
Producer's throttle metrics over a fake broker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from memq.config import QuotaConfig, load_config
from memq.errors import ConfigError
from memq.format.wire import Ack, AckCode, decode_request
from memq.security.quota import ANONYMOUS, QuotaTable, Throttler, TokenBucket, parse_overrides
from tests.support.producer import FakeBroker, producer

RATE = 100_000.0   # bytes/s


def test_bucket_lets_one_burst_through_then_charges_debt_as_time() -> None:
    b = TokenBucket(RATE, burst_s=0.5, max_delay_s=10.0, now=0.0)
    assert b.charge(50_000, 0.0) == 0.0                    # exactly the burst: no debt
    assert b.charge(20_000, 0.0) == pytest.approx(0.2)     # 20 kB of debt at 100 kB/s
    assert b.charge(0, 0.2) == 0.0                         # paid back by waiting that long
    assert b.charge(0, 100.0) == 0.0
    assert b.tokens == pytest.approx(50_000)               # idle time refills to the burst, no more


def test_bucket_gives_no_credit_for_a_clock_that_goes_back() -> None:
    b = TokenBucket(RATE, burst_s=0.1, max_delay_s=10.0, now=10.0)
    b.charge(30_000, 10.0)                                  # 20 kB of debt
    assert b.charge(0, 5.0) == pytest.approx(0.2)
    assert b.charge(0, 10.1) == pytest.approx(0.1)


def test_lowering_a_rate_keeps_the_debt_and_caps_the_credit() -> None:
    b = TokenBucket(RATE, burst_s=1.0, max_delay_s=10.0, now=0.0)
    b.set_rate(10_000)
    assert b.tokens == 10_000
    assert b.charge(20_000, 0.0) == pytest.approx(1.0)


def greedy_client(throttler: Throttler, request: int, span_s: float) -> int:
    """Bytes a client gets accepted in `span_s` when it sends `request`-byte Messages back to back
    and the broker reads its next one only after the throttle time (as ProduceConnection does)."""
    now, sent = 0.0, 0
    while now < span_s:
        sent += request
        now += throttler.charge("noisy", "orders", request, now) + 1e-4   # + time to receive one
    return sent


@pytest.mark.parametrize(("request_bytes", "burst_s"), [(1_000, 1.0), (64_000, 0.2), (250_000, 1.0)])
def test_a_greedy_client_is_held_to_its_rate(request_bytes: int, burst_s: float) -> None:
    span = 60.0
    t = Throttler(QuotaTable(principal_default=RATE), burst_s=burst_s, max_delay_s=5.0)
    sent = greedy_client(t, request_bytes, span)
    # the bound in the module docstring: rate x span + one burst + the request that went into debt
    assert sent <= RATE * span + RATE * burst_s + request_bytes
    assert sent >= RATE * span - request_bytes            # and delaying costs it nothing more


def test_messages_over_rate_times_max_delay_get_one_per_pause_and_no_growing_debt() -> None:
    t = Throttler(QuotaTable(principal_default=RATE), burst_s=0.1, max_delay_s=0.5)
    assert t.charge("noisy", "orders", 10**9, 0.0) == 0.5                 # capped...
    assert t.charge("noisy", "orders", 0, 0.5) == 0.0                     # ...and the rest forgiven
    sent = greedy_client(t, 250_000, 60.0)
    assert sent == pytest.approx(250_000 * 60.0 / 0.5, rel=0.01)          # the documented overrun


def test_a_request_pays_for_the_tighter_of_its_principal_and_topic_quotas() -> None:
    table = QuotaTable(principal_default=RATE, topics={"slow": RATE / 10})
    t = Throttler(table, burst_s=0.01, max_delay_s=100.0)   # bursts: 1000 B (alice), 100 B (slow)
    assert t.charge("alice", "slow", 2_000, 0.0) == pytest.approx(1_900 / (RATE / 10))   # the topic's
    assert t.charge("bob", "fast", 2_000, 0.0) == pytest.approx(1_000 / RATE)            # bob's own


def test_tenants_have_their_own_buckets() -> None:
    t = Throttler(QuotaTable(principal_default=RATE), burst_s=1.0, max_delay_s=5.0)
    assert t.charge("noisy", "a", 10 * int(RATE), 0.0) == 5.0   # capped at max_throttle_s
    assert t.charge("quiet", "a", int(RATE), 0.0) == 0.0        # another principal: its own burst
    assert t.charge(ANONYMOUS, "a", int(RATE), 0.0) == 0.0


def test_no_quota_means_no_delay_and_an_override_of_zero_exempts() -> None:
    t = Throttler(QuotaTable(principal_default=RATE, principals={"ops": 0.0}), burst_s=1.0, max_delay_s=5.0)
    assert t.charge("ops", "a", 10**12, 0.0) == 0.0
    assert Throttler(QuotaTable(), burst_s=1.0, max_delay_s=5.0).charge("x", "y", 10**12, 0.0) == 0.0


def test_a_changed_rate_from_the_source_applies_on_the_next_request() -> None:
    class Source:
        rate: float | None = RATE

        def principal_rate(self, principal: str) -> float | None:
            return self.rate

        def topic_rate(self, topic: str) -> float | None:
            return None

    src = Source()
    t = Throttler(src, burst_s=1.0, max_delay_s=100.0)
    assert t.charge("p", "t", int(RATE), 0.0) == 0.0
    src.rate = RATE / 2
    assert t.charge("p", "t", int(RATE), 0.0) == pytest.approx(2.0)
    src.rate = None
    assert t.charge("p", "t", int(RATE), 0.0) == 0.0


def test_overrides_parse() -> None:
    assert parse_overrides(["alice=1000", "svc.ingest = 2.5e6", "ops=0"], "quota.principals") == \
        {"alice": 1000.0, "svc.ingest": 2.5e6, "ops": 0.0}


@pytest.mark.parametrize("line", ["alice", "=100", "alice=", "alice=fast", "alice=-1", "alice=nan", "alice=inf"])
def test_bad_overrides_name_the_setting_and_the_line(line: str) -> None:
    with pytest.raises(ConfigError, match=rf"quota\.topics\[1\]: '{line}' is not 'NAME=BYTES_PER_SECOND'"):
        QuotaConfig(topics=("ok=1", line))


def test_an_override_given_twice_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"quota\.principals\[1\]: 'alice' is given twice"):
        QuotaConfig(principals=("alice=1", "alice=2"))


def test_quota_section_from_file_and_environment(tmp_path: Path) -> None:
    config = load_config(env={"MEMQ_QUOTA_PRINCIPAL_BYTE_RATE": "1048576",
                              "MEMQ_QUOTA_TOPICS": "orders=5e5, audit=0", "MEMQ_QUOTA_BURST_S": "0.5"})
    table = config.quota.table()
    assert table.principal_rate("anyone") == 1048576
    assert (table.topic_rate("orders"), table.topic_rate("audit"), table.topic_rate("other")) == (5e5, None, None)
    with pytest.raises(ConfigError, match=r"quota\.principals\[0\]: 'bob' is not"):
        load_config(env={"MEMQ_QUOTA_PRINCIPALS": "bob"})
    with pytest.raises(ConfigError, match=r"quota\.max_throttle_ms = 60000 is out of range"):
        load_config(env={"MEMQ_QUOTA_MAX_THROTTLE_MS": "60000"})
    with pytest.raises(ConfigError, match=r"quota: unknown setting\(s\) byte_rate"):
        (tmp_path / "memq.toml").write_text("[quota]\nbyte_rate = 5\n")
        load_config(tmp_path / "memq.toml", env={})


class ThrottlingBroker(FakeBroker):
    """Accepts every frame; its n-th ack says the connection was throttled 40 x n ms."""

    async def send(self, frame: bytes | bytearray) -> None:
        self.frames.append(bytes(frame))
        ack = Ack(decode_request(self.frames[-1]).request_id, True, throttle_ms=40 * len(self.frames))
        asyncio.get_running_loop().call_soon(self.on_ack, ack)


async def test_the_producer_counts_throttle_time_from_acks_and_delivers() -> None:
    broker = ThrottlingBroker([AckCode.OK])
    async with producer(broker) as p:
        futures = []
        for value in (b"a", b"b", b"c"):
            futures.append(await p.send("t", value))
            await p.flush()
        assert [(await f).sequence for f in futures] == [0, 1, 2]   # throttled, not failed
        m = p.metrics
        assert (m.throttled_acks, m.throttle_ms_total, m.throttle_ms_max) == (3, 240, 120)

"""The Kafka listener's idle-seal credit: a bulk connection's small last batch may seal early, a
trickle's may not, and early objects stay at most one per `unit` bytes sent."""

from __future__ import annotations

from memq.kafka_api.idle_seal import SealCredit

MiB = 1024 * 1024


def test_a_fresh_connection_seals_only_batches_of_a_unit() -> None:
    c = SealCredit(unit=MiB, bank=4 * MiB)
    c.earn(5)
    assert c.threshold() == MiB


def test_a_unit_sent_buys_one_early_seal_of_any_size() -> None:
    c = SealCredit(unit=MiB, bank=4 * MiB)
    c.earn(MiB - 1)
    assert c.threshold() == MiB
    c.earn(1)
    assert c.threshold() == 1
    c.spend()
    assert c.threshold() == MiB


def test_early_seals_are_at_most_one_per_unit_sent() -> None:
    c = SealCredit(unit=MiB, bank=4 * MiB)
    c.earn(int(2.5 * MiB))
    seals = 0
    while c.threshold() == 1:
        c.spend()
        seals += 1
    assert seals == 2


def test_the_bank_caps_what_a_bulk_producer_turned_trickle_may_spend() -> None:
    c = SealCredit(unit=MiB, bank=4 * MiB)
    c.earn(100 * MiB)
    seals = 0
    while c.threshold() == 1:
        c.spend()
        seals += 1
    assert seals == 4
    c.spend()                      # a large batch's seal with no credit left: floor at zero
    c.earn(MiB)
    assert c.threshold() == 1

"""The chaos checker must see each kind of damage, so a run cannot pass by seeing nothing."""

from __future__ import annotations

import dataclasses

from memq.chaos.checker import (ABORT, COMMIT, DOUBT, AckEvent, Delivered, FaultWindow, Observations, Pointer,
                                StoredObject, TxnWrite, check, check_txn)


def _clean() -> Observations:
    ids = [f"p0-{i}" for i in range(6)]
    return Observations(
        acks=[AckEvent("p0", rid, i, i + 0.5, True) for i, rid in enumerate(ids)],
        delivered=[Delivered(rid, 10.0 + i) for i, rid in enumerate(ids)],
        pointers=[Pointer(0, 0, "a"), Pointer(1, 0, "b")],
        objects=[StoredObject("a", tuple(ids[:3])), StoredObject("b", tuple(ids[3:]))],
        faults=[FaultWindow("kill b1", 1.0, 2.0)],
        run_start_s=0.0, produce_end_s=6.0)


def test_clean_run_passes() -> None:
    v = check(_clean())
    assert v.passed and v.problems() == []
    assert (v.acked, v.acked_lost, v.duplicates, v.dangling_pointers, v.orphan_objects) == (6, 0, 0, 0, 0)
    assert v.max_write_gap_s == 1.0
    assert v.catch_up_s == 9.0
    assert v.faults[0].heal_to_first_ack_s == 0.5 and v.faults[0].sends == 2


def test_deleted_object_is_a_dangling_pointer_and_loss() -> None:
    obs = _clean()
    v = check(dataclasses.replace(obs, objects=obs.objects[:1]))
    assert not v.passed
    assert v.dangling_pointers == 1 and v.acked_lost == 3
    assert v.lost_ids == ("p0-3", "p0-4", "p0-5")


def test_dropped_notification_is_an_orphan_and_loss() -> None:
    obs = _clean()
    v = check(dataclasses.replace(obs, pointers=obs.pointers[1:]))
    assert not v.passed
    assert v.orphan_objects == 1 and v.acked_lost == 3 and v.dangling_pointers == 0
    assert v.faults[0].acked_lost == 2      # p0-1 and p0-2 were sent inside the fault window


def test_duplicated_batch_is_counted() -> None:
    obs = _clean()
    dup = StoredObject("a2", obs.objects[0].record_ids)
    v = check(dataclasses.replace(
        obs, objects=[*obs.objects, dup], pointers=[*obs.pointers, Pointer(2, 0, "a2")],
        delivered=[*obs.delivered, *(Delivered(r, 20.0) for r in dup.record_ids)]))
    assert v.passed                         # duplicates are not loss
    assert v.duplicates == 3 and v.stored_duplicates == 3


def test_unacked_but_present_and_missed_by_consumer() -> None:
    obs = _clean()
    acks = [dataclasses.replace(a, ok=False) if a.record_id == "p0-0" else a for a in obs.acks]
    v = check(dataclasses.replace(obs, acks=acks, delivered=obs.delivered[:-1]))
    assert v.unacked_but_present == 1
    assert v.consumer_missed == 1 and not v.passed
    assert v.catch_up_s is None


def test_write_gap_spans_failed_acks() -> None:
    obs = _clean()
    acks = [dataclasses.replace(a, ok=False) if a.record_id in ("p0-2", "p0-3") else a for a in obs.acks]
    assert check(dataclasses.replace(obs, acks=acks)).max_write_gap_s == 3.0


def test_redeliveries_count_against_the_fault_before_them() -> None:
    """A consumer SIGKILLed at t=1 and restarted re-reads what it had not committed."""
    obs = _clean()
    again = [Delivered("p0-0", 12.0), Delivered("p0-1", 12.5), Delivered("p0-2", 30.0)]
    faults = [FaultWindow("kill-consumer:consumer 1s", 1.0, 2.0), FaultWindow("kill b1", 25.0, 26.0)]
    v = check(dataclasses.replace(obs, delivered=[*obs.delivered, *again], faults=faults))
    assert v.passed and v.duplicates == 3
    assert [f.redelivered for f in v.faults] == [2, 1]


def test_fault_write_gap_runs_to_the_first_ack_after_the_heal() -> None:
    obs = _clean()
    acks = [dataclasses.replace(a, ok=False) if a.record_id in ("p0-1", "p0-2") else a for a in obs.acks]
    v = check(dataclasses.replace(obs, acks=acks, faults=[FaultWindow("pause:s3", 1.0, 2.0)]))
    # acks done at 0.5 and 3.5: from the fault's start (1.0) to the first ack after its heal
    assert (v.faults[0].max_write_gap_s, v.faults[0].heal_to_first_ack_s) == (2.5, 1.5)


def test_write_amplification_counts_every_stored_copy_per_acked_record() -> None:
    """Resends stored again, announced or not (an orphan is a write too), against the fault
    whose window their first send fell in."""
    obs = _clean()
    assert check(obs).write_amplification == 1.0 and check(obs).faults[0].write_amplification == 1.0
    again = [StoredObject("c", ("p0-1", "p0-2")), StoredObject("d", ("p0-1",))]   # "d" never announced
    v = check(dataclasses.replace(obs, objects=[*obs.objects, *again], pointers=[*obs.pointers, Pointer(2, 0, "c")]))
    assert v.passed and v.write_amplification == 9 / 6
    assert v.faults[0].write_amplification == 5 / 2      # p0-1 stored 3 times, p0-2 twice, both sent inside


def _txns() -> tuple[list[TxnWrite], list[Pointer], list[StoredObject]]:
    """Transaction t0 committed (object a), t1 aborted (object b, stored, never announced), t2 in doubt."""
    writes = ([TxnWrite(f"c{i}", "t0", COMMIT) for i in range(3)] + [TxnWrite(f"x{i}", "t1", ABORT) for i in range(2)]
              + [TxnWrite(f"d{i}", "t2", DOUBT) for i in range(2)])
    return writes, [Pointer(0, 0, "a")], [StoredObject("a", ("c0", "c1", "c2")), StoredObject("b", ("x0", "x1"))]


def test_transactions_pass_when_committed_are_read_once_and_aborted_nowhere() -> None:
    writes, pointers, objects = _txns()
    v = check_txn(writes, pointers, objects, ["c0", "c1", "c2"])
    assert v.passed and v.problems() == []
    assert (v.transactions, v.committed, v.aborted, v.in_doubt) == (3, 3, 2, 2)
    both = check_txn(writes, [*pointers, Pointer(1, 0, "d")], [*objects, StoredObject("d", ("d0", "d1"))],
                     ["c0", "c1", "c2", "d0", "d1"])
    assert both.passed   # in doubt: all of it is as good as none


def test_transactions_see_aborted_visible_torn_missed_and_duplicated() -> None:
    writes, pointers, objects = _txns()
    shown = check_txn(writes, [*pointers, Pointer(1, 0, "b")], objects, ["c0", "c1", "c2"])
    assert not shown.passed and shown.aborted_visible == 2 and "x0" in shown.sample
    assert check_txn(writes, pointers, objects, ["c0", "c1", "c2"], delivered=["x1"]).aborted_visible == 1
    torn = check_txn(writes, pointers, [*objects, StoredObject("d", ("d0",))], ["c0", "c1", "c2"],
                     delivered=["d0"])
    assert torn.torn == 1 and not torn.passed
    v = check_txn(writes, pointers, objects, ["c0", "c1", "c1"])
    assert (v.read_missed, v.read_duplicates) == (1, 1) and len(v.problems()) == 3

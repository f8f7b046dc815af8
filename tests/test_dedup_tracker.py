"""Producer-sequence de-duplication (`SequenceTracker`): pure, no I/O. Each case is one way a
duplicate reaches a reader, or one way a first delivery must not be mistaken for one."""

from __future__ import annotations

import random

from memq.client.positions import SequenceTracker


def deliver(t: SequenceTracker, messages: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """The Messages a reader hands over: those not seen before."""
    return [m for m in messages if not t.seen(*m)]


def test_in_order_is_one_range_and_a_resend_is_dropped() -> None:
    t = SequenceTracker(max_producers=10, window=64)
    assert deliver(t, [(1, 0, s) for s in range(1000)]) == [(1, 0, s) for s in range(1000)]
    assert t.ranges(1, 0) == [(0, 1000)]                 # memory: one range, however many Messages
    assert t.seen(1, 0, 0) and t.seen(1, 0, 500) and t.seen(1, 0, 999)
    assert not t.seen(1, 0, 1000)


def test_reordered_sequences_are_all_delivered_once() -> None:
    """6 before 5 (other broker, other read partition): 5 is not a duplicate."""
    t = SequenceTracker(max_producers=10, window=64)
    order = [0, 1, 2, 3, 4, 6, 7, 5, 9, 8, 5, 6, 10]
    out = deliver(t, [(1, 0, s) for s in order])
    assert [s for _, _, s in out] == [0, 1, 2, 3, 4, 6, 7, 5, 9, 8, 10]
    assert t.ranges(1, 0) == [(0, 11)]                   # gaps closed: back to one range


def test_shuffled_stream_with_resends_delivers_each_sequence_exactly_once() -> None:
    rng = random.Random(7)
    seqs = list(range(2000))
    stream = seqs + rng.sample(seqs, 300)                # 300 resends
    # bounded disorder, as partitions read at different paces
    stream = [s for _, s in sorted((i + rng.randint(0, 40), s) for i, s in enumerate(stream))]
    t = SequenceTracker(max_producers=10, window=1024)
    out = deliver(t, [(3, 1, s) for s in stream])
    assert sorted(s for _, _, s in out) == seqs


def test_a_gap_that_never_closes_is_kept_apart_then_forgotten_never_claimed() -> None:
    """Sequence 5 never comes (the producer gave up, or another group member reads it): it
    stays unseen; once more than `window` sequences above it were seen, what is below is
    forgotten. A late 5 is still delivered: bounded memory may let an old resend through, it
    never drops a first delivery."""
    t = SequenceTracker(max_producers=10, window=64)
    deliver(t, [(1, 0, s) for s in [*range(5), *range(6, 10)]])
    assert t.ranges(1, 0) == [(0, 5), (6, 10)]
    deliver(t, [(1, 0, 70), (1, 0, 80)])                 # 80 is more than 64 above 0..15: forgotten
    assert t.ranges(1, 0) == [(70, 71), (80, 81)]
    assert not t.seen(1, 0, 5)                           # first seen late: delivered
    assert not t.seen(1, 0, 2)                           # forgotten: a resend would pass (duplicate, not loss)
    assert t.seen(1, 0, 70) and t.seen(1, 0, 80)         # recent ones are still caught


def test_a_backlog_read_partition_by_partition_drops_every_resend() -> None:
    """After a stall a consumer reads each read partition's backlog in long runs: a producer's
    sequences, spread over two brokers and three partitions, come as thousands of gaps, and
    the resends (another broker's copies) come after all originals. Memory follows the span."""
    rng = random.Random(3)
    seqs = list(range(6000))
    partitions: list[list[int]] = [[], [], []]
    for s in seqs:
        partitions[rng.randrange(3)].append(s)
    resent = rng.sample(seqs, 400)
    t = SequenceTracker(max_producers=10, window=65_536)
    out = deliver(t, [(4, 0, s) for s in [*partitions[0], *partitions[1], *partitions[2], *resent]])
    assert sorted(s for _, _, s in out) == seqs
    assert t.ranges(4, 0) == [(0, 6000)]                 # every gap closed: a floor, no bitmap left


def test_a_bitmap_window_bounds_memory_and_the_in_order_prefix_is_kept() -> None:
    t = SequenceTracker(max_producers=10, window=1024)
    deliver(t, [(2, 0, s) for s in range(100_000)])
    assert t.ranges(2, 0) == [(0, 100_000)] and t.seen(2, 0, 7)   # in order: the floor remembers all
    assert t.footprint(2, 0) <= 1
    deliver(t, [(3, 0, s) for s in range(0, 100_000, 2)])         # half never comes
    assert t.footprint(3, 0) <= 1024 // 8
    assert t.seen(3, 0, 99_998) and not t.seen(3, 0, 99_999)


def test_consumer_group_member_sees_every_other_run_and_stays_bounded() -> None:
    """A group member reads some partitions only: its sequences come in runs with gaps that
    never close. Memory stays within the window, and recent resends are still dropped."""
    t = SequenceTracker(max_producers=10, window=1024)
    mine = [s for s in range(100_000) if (s // 50) % 3 == 0]          # runs of 50, 1 in 3
    assert len(deliver(t, [(9, 0, s) for s in mine])) == len(mine)
    assert t.footprint(9, 0) <= 1024 // 8
    assert t.seen(9, 0, mine[-1]) and t.seen(9, 0, mine[-120])


def test_resend_across_partitions_is_dropped_whichever_copy_comes_first() -> None:
    t = SequenceTracker(max_producers=10, window=64)
    partition_a = [(1, 0, 10), (1, 0, 11), (1, 0, 12)]   # the original batch
    partition_b = [(1, 0, 11), (1, 0, 12), (1, 0, 13)]   # a resend of 11..12 stored by another broker
    assert deliver(t, partition_b) == partition_b
    assert deliver(t, partition_a) == [(1, 0, 10)]


def test_a_new_epoch_is_a_new_producer_instance() -> None:
    t = SequenceTracker(max_producers=10, window=64)
    assert deliver(t, [(1, 0, 0), (1, 0, 1)]) == [(1, 0, 0), (1, 0, 1)]
    assert deliver(t, [(1, 1, 0), (1, 1, 1)]) == [(1, 1, 0), (1, 1, 1)]   # restarted producer, sequence 0 again
    assert t.seen(1, 1, 0) and t.seen(1, 0, 1)
    assert not t.seen(2, 0, 0)                                            # another producer id


def test_many_producers_are_bounded_least_recently_used_first() -> None:
    t = SequenceTracker(max_producers=100, window=64)
    for pid in range(1000):
        for s in range(3):
            assert not t.seen(pid, 0, s)
    assert len(t) == 100
    assert t.seen(999, 0, 1)
    assert not t.seen(0, 0, 1)                           # forgotten: delivered again, never lost
    for pid in range(901, 1000):                         # keep 901.. busy; 900 becomes the oldest
        t.seen(pid, 0, 3)
    t.seen(5000, 0, 0)
    assert t.ranges(900, 0) == [] and t.ranges(999, 0) == [(0, 4)]


def test_clear_forgets_every_producer() -> None:
    t = SequenceTracker(max_producers=10, window=64)
    t.seen(1, 0, 0)
    t.clear()
    assert len(t) == 0 and not t.seen(1, 0, 0)

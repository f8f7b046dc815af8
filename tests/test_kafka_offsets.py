"""Kafka offsets of memq records (memq.kafka_api.offsets): a pure, order-keeping, invertible map."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.errors import InvalidInputError
from memq.format.batch import MAX_PART_LOGMESSAGES
from memq.kafka_api.offsets import MAX_NOTIFICATION_OFFSET, first_offset, kafka_offset, produce_base_offset, split_offset

notes = st.integers(0, MAX_NOTIFICATION_OFFSET - 1)
indexes = st.integers(0, MAX_PART_LOGMESSAGES - 1)


@given(notes, indexes)
def test_split_inverts_kafka_offset_and_offsets_fit_an_i64(note: int, index: int) -> None:
    offset = kafka_offset(note, index)
    assert 0 <= offset < 1 << 63
    assert split_offset(offset) == (note, index)


@given(st.integers(0, (1 << 63) - 1))
def test_every_kafka_offset_splits_into_a_place_that_maps_back(offset: int) -> None:
    assert kafka_offset(*split_offset(offset)) == offset


@given(notes, indexes, notes, indexes)
def test_offsets_order_records_as_notifications_then_indexes_do(n1: int, i1: int, n2: int, i2: int) -> None:
    assert (kafka_offset(n1, i1) < kafka_offset(n2, i2)) == ((n1, i1) < (n2, i2))


@given(notes, indexes)
def test_a_part_starts_at_its_first_offset_and_ends_before_the_next_part(note: int, index: int) -> None:
    assert first_offset(note) <= kafka_offset(note, index)
    if note + 1 < MAX_NOTIFICATION_OFFSET:
        assert kafka_offset(note, index) < first_offset(note + 1)


@pytest.mark.parametrize("note, index", [(-1, 0), (0, -1), (0, MAX_PART_LOGMESSAGES), (MAX_NOTIFICATION_OFFSET, 0)])
def test_places_outside_the_scheme_are_refused(note: int, index: int) -> None:
    with pytest.raises(InvalidInputError):
        kafka_offset(note, index)


def test_negative_offsets_are_refused() -> None:
    with pytest.raises(InvalidInputError):
        split_offset(-1)


def test_a_produce_answers_its_first_records_offset_only_when_a_client_can_count_on_from_it() -> None:
    """A client numbers a partition's records base, base + 1, ...: so the base offset is given
    when the request's batches are consecutive records of one part, else -1 (unknown)."""
    assert produce_base_offset([(5, 10, 3)]) == kafka_offset(5, 10)
    assert produce_base_offset([(5, 10, 3), (5, 13, 2)]) == kafka_offset(5, 10)
    # unknown: minus the record count, so that a client's numbers (base, base + 1, ...) all stay negative
    assert produce_base_offset([(5, 10, 3), (5, 14, 2)]) == -5    # another producer's records between
    assert produce_base_offset([(5, 10, 3), (6, 0, 2)]) == -5     # the second batch in the next part
    assert produce_base_offset([(-1, -1, 3)]) == -3              # acks=1: not published yet
    assert produce_base_offset([(-1, -1, 1)]) == -1
    assert produce_base_offset([]) == -1

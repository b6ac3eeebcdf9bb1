"""The runtime's Slice-Gather plan (gbmw.adapters.runtime.redistribute.transfers): every rank gets exactly the
rows of its new slice, each from a rank that holds them, and receives from others what the planner prices (the
forward part of gbmw.ranks.transition_fraction) — never the whole group's slices."""

import itertools

import pytest

from gbmw.ranks import activation_layout
from gbmw.space.strategy import Strategy

pytestmark = [pytest.mark.torch]

NAMES = ["dp4", "tp4", "tp2-dp2", "dp2-tp2", "sdp2-tp2", "tp2-z1dp2", "sdp4"]


@pytest.mark.parametrize("previous, current", list(itertools.permutations(NAMES, 2)))
def test_each_rank_receives_its_missing_rows_once_from_a_holder(previous, current):
    from gbmw.adapters.runtime.redistribute import BatchLayout, _rows, transfers

    held, needed = BatchLayout.of(Strategy.parse(previous)), BatchLayout.of(Strategy.parse(current))
    rows = 8
    plan = transfers(held, needed, rows)
    for receiver, index in enumerate(needed.slice_of_rank):
        low, high = _rows(needed, index, rows)
        pieces = sorted((start, stop, sender) for sender, target, start, stop in plan if target == receiver)
        assert [start for start, _, _ in pieces] == [low] + [stop for _, stop, _ in pieces[:-1]]  # contiguous
        assert pieces[-1][1] == high
        for start, stop, sender in pieces:
            sender_low, sender_high = _rows(held, held.slice_of_rank[sender], rows)
            assert sender_low <= start and stop <= sender_high  # the sender holds these rows
        received = sum(stop - start for start, stop, sender in pieces if sender != receiver)
        (held_index, held_count), (needed_index, needed_count) = (activation_layout(Strategy.parse(previous))[receiver],
                                                                  activation_layout(Strategy.parse(current))[receiver])
        overlap = max(0.0, min((held_index + 1) / held_count, (needed_index + 1) / needed_count)
                      - max(held_index / held_count, needed_index / needed_count))
        assert received / rows == pytest.approx(1 / needed_count - overlap)  # what R prices for the forward


SEQUENCE_NAMES = ["dp4", "cp4", "ulysses4", "cp2-dp2", "ulysses2-dp2", "tp2-cp2", "dp2-tp2"]


@pytest.mark.parametrize("previous, current", list(itertools.permutations(SEQUENCE_NAMES, 2)))
def test_each_rank_receives_its_missing_tokens_once_from_a_holder(previous, current):
    """Between CP's chunks (j and 2c − 1 − j of 2c), Ulysses' parts and batch slices: every (row, token) cell a rank
    needs arrives exactly once, from a rank that holds it, and what it receives from others is the forward part of
    what transition_fraction prices."""
    from gbmw.adapters.runtime.redistribute import BatchLayout, _cells, block_transfers
    from gbmw.ranks import transition_fraction

    held, needed = BatchLayout.of(Strategy.parse(previous)), BatchLayout.of(Strategy.parse(current))
    rows, tokens = 4, 16
    plan = block_transfers(held, needed, rows, tokens)
    largest = 0.0
    for receiver in range(4):
        wanted = {(row, token) for (low, high), (first, last) in _cells(needed, receiver, rows, tokens)
                  for row in range(low, high) for token in range(first, last)}
        arrived = [(row, token, sender) for sender, target, (low, high), (first, last) in plan if target == receiver
                   for row in range(low, high) for token in range(first, last)]
        assert sorted((row, token) for row, token, _ in arrived) == sorted(wanted)  # each cell once
        for row, token, sender in arrived:
            assert any(low <= row < high and first <= token < last
                       for (low, high), (first, last) in _cells(held, sender, rows, tokens))
        kept = {(row, token) for (low, high), (first, last) in _cells(held, receiver, rows, tokens)
                for row in range(low, high) for token in range(first, last)}
        received = sum(sender != receiver for _, _, sender in arrived) / (rows * tokens)
        assert received == pytest.approx(len(wanted - kept) / (rows * tokens))  # only what it lacks
        largest = max(largest, received + len(kept - wanted) / (rows * tokens))
    assert largest == pytest.approx(transition_fraction(Strategy.parse(previous), Strategy.parse(current)))

"""Slot tables: shares follow weights, changes move the minimum."""
import random

import pytest

from rlbswitch.slots import apportion, build_slots, moved_fraction

SLOTS = 4096


def shares(table, n):
    return [table.count(i) / len(table) for i in range(n)]


def test_apportion_sums_and_rounds_by_largest_remainder():
    assert apportion([1, 1, 1], 10) == [4, 3, 3]
    assert apportion([3, 1], 4096) == [3072, 1024]
    assert sum(apportion([7, 5, 3, 2], 4096)) == 4096
    with pytest.raises(ValueError):
        apportion([0, 0], 8)
    with pytest.raises(ValueError):
        apportion([1, -1], 8)


@pytest.mark.parametrize("weights", [[1, 1, 1, 1], [4, 2, 1, 1], [1, 2, 3, 4], [97, 3], [5] * 7])
def test_each_share_within_one_slot_of_its_weight(weights):
    table = build_slots(list(range(len(weights))), weights, SLOTS)
    for got, w in zip(shares(table, len(weights)), weights):
        assert abs(got - w / sum(weights)) <= 1 / SLOTS


@pytest.mark.parametrize("n", [2, 4, 8, 16])
def test_removing_a_member_moves_only_its_slots(n):
    members = [100 + i for i in range(n)]
    old = [members[i] for i in build_slots(members, [1] * n, SLOTS)]
    gone = members[n // 2]
    rest = [m for m in members if m != gone]
    new = [rest[i] for i in build_slots(rest, [1] * (n - 1), SLOTS, previous=old)]
    moved = moved_fraction(old, new)
    assert moved <= 1 / n + 0.01
    # every moved slot belonged to the removed member: nobody else was disturbed
    assert all(o == gone for o, nw in zip(old, new) if o != nw)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_adding_a_member_moves_at_most_its_new_share(n):
    members = list(range(1, n + 1))
    old = [members[i] for i in build_slots(members, [1] * n, SLOTS)]
    grown = members + [99]
    new = [grown[i] for i in build_slots(grown, [1] * (n + 1), SLOTS, previous=old)]
    assert moved_fraction(old, new) <= 1 / (n + 1) + 0.01
    assert all(nw == 99 for o, nw in zip(old, new) if o != nw)


def test_weight_change_moves_exactly_the_difference():
    members = ["a", "b", "c", "d"]
    old = [members[i] for i in build_slots(members, [1, 1, 1, 1], SLOTS)]
    new = [members[i] for i in build_slots(members, [1, 1, 1, 3], SLOTS, previous=old)]
    # d goes from 1/4 to 1/2 of the slots: exactly 1/4 of all slots move, all to d
    assert moved_fraction(old, new) == pytest.approx(0.25, abs=2 / SLOTS)
    assert all(nw == "d" for o, nw in zip(old, new) if o != nw)


def test_random_changes_never_move_more_than_needed():
    rnd = random.Random(7)
    members, weights = list(range(6)), [1] * 6
    table = [members[i] for i in build_slots(members, weights, SLOTS)]
    for _ in range(50):
        weights = [rnd.randint(0, 5) for _ in members]
        if not any(weights):
            weights[0] = 1
        live = [(m, w) for m, w in zip(members, weights) if w]
        new = [live[i][0] for i in build_slots([m for m, _ in live], [w for _, w in live], SLOTS,
                                               previous=table)]
        # lower bound for any table with the new quotas: sum of positive quota deficits
        quota = dict(zip([m for m, _ in live], apportion([w for _, w in live], SLOTS)))
        need = sum(max(0, quota.get(m, 0) - table.count(m)) for m in members)
        assert sum(a != b for a, b in zip(table, new)) == need
        table = new


def test_interleaved_fresh_table():
    table = build_slots([1, 2], [1, 1], 8)
    assert table == [0, 1, 0, 1, 0, 1, 0, 1]


def test_bad_input():
    with pytest.raises(ValueError):
        build_slots([1, 1], [1, 1], 8)
    with pytest.raises(ValueError):
        build_slots([1, 2], [1], 8)

"""Row partitions cover all rows disjointly and balance what they promise to balance."""
import numpy as np
import pytest

from hisparse.errors import LayoutError
from hisparse.partition import (group_by_owner, group_pairs, nnz_balanced_blocks, partition_rows,
                                row_modulo)


def _indptr(lengths):
    return np.concatenate([[0], np.cumsum(lengths)])


@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_modulo", "row_blocks"])
@pytest.mark.parametrize("nparts", [1, 2, 3, 7])
def test_parts_are_disjoint_and_cover(strategy, nparts):
    lengths = np.random.default_rng(nparts).integers(0, 50, size=101)
    plan = partition_rows(_indptr(lengths), nparts, strategy)
    rows = np.concatenate(plan.rows)
    assert np.array_equal(np.sort(rows), np.arange(101))
    assert all(len(r) > 0 for r in plan.rows)
    assert plan.nnz_per_part(_indptr(lengths)).sum() == lengths.sum()


def test_nnz_balanced_blocks_balance_a_skewed_matrix():
    lengths = np.ones(1000, dtype=np.int64)
    lengths[:10] = 1000  # heavy head: equal row counts would put most entries on rank 0
    indptr = _indptr(lengths)
    bounds = nnz_balanced_blocks(indptr, 4)
    per_part = np.diff(indptr[bounds])
    assert per_part.max() / per_part.mean() < 1.1
    equal = partition_rows(indptr, 4, "row_blocks").nnz_per_part(indptr)
    assert equal.max() / equal.mean() > 3


def test_row_modulo_is_the_seed_layout():
    parts = row_modulo(10, 3)
    assert [p.tolist() for p in parts] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def test_empty_rows_still_give_every_rank_a_row():
    lengths = np.zeros(8, dtype=np.int64)
    lengths[0] = 100
    bounds = nnz_balanced_blocks(_indptr(lengths), 4)
    assert np.all(np.diff(bounds) >= 1)


def test_more_ranks_than_rows():
    with pytest.raises(LayoutError, match="more ranks \\(5\\) than rows \\(4\\)"):
        partition_rows(_indptr([1, 1, 1, 1]), 5, "nnz_balanced")


@pytest.mark.parametrize("nparts", [1, 4, 300])
@pytest.mark.parametrize("piece", [None, 97])
def test_group_by_owner_is_the_stable_sort(monkeypatch, nparts, piece):
    """The grouping (one sort, or pieces sorted on threads and their groups placed) is NumPy's
    stable argsort of the owners, ranks without items included; the cuts are the counts' running
    sums."""
    from hisparse.partition import _rows
    if piece is not None:  # the pieces' route, whatever cores this host has
        monkeypatch.setattr(_rows, "GROUP_PIECE", piece)
        monkeypatch.setattr(_rows, "usable_cores", lambda: 4)
    rng = np.random.default_rng(nparts)
    owner = rng.integers(0, max(nparts - 1, 1), 5000)  # the last rank owns nothing
    order, cuts = group_by_owner(owner, nparts)
    np.testing.assert_array_equal(order, np.argsort(owner, kind="stable"))
    np.testing.assert_array_equal(cuts, np.concatenate(
        [[0], np.cumsum(np.bincount(owner, minlength=nparts))]))
    empty_order, empty_cuts = group_by_owner(np.zeros(0, dtype=np.int64), nparts)
    assert len(empty_order) == 0 and np.all(empty_cuts == 0)


@pytest.mark.parametrize("parts,bounds_kind,cores", [(1, "bounds", 4), (3, "bounds", 5),
                                                     (5, "modulo", 3), (7, "empty_parts", 64)])
def test_group_pairs_compiled_equals_the_stable_sort(monkeypatch, parts, bounds_kind, cores):
    """group_pairs' compiled placement (forced at any size and core count) gives the pairs
    grouped as group_by_owner's stable sort and two gathers do: each part's pairs in their own
    order, the cuts between them; parts by key ranges (some empty) or modulo."""
    from hisparse import threads
    from hisparse.partition import _rows
    rng = np.random.default_rng(parts)
    keys = rng.integers(0, 1000, 20_000).astype(np.int64)
    values = np.arange(len(keys), dtype=np.int64) * 7
    bounds = None
    if bounds_kind == "bounds":
        bounds = np.linspace(0, 1000, parts + 1).astype(np.int64)
    elif bounds_kind == "empty_parts":
        bounds = np.array([0, 0, 100, 100, 100, 640, 1000, 1000], dtype=np.int64)
        parts = len(bounds) - 1
    owner = keys % parts if bounds is None else np.searchsorted(bounds, keys, "right") - 1
    order = np.argsort(owner, kind="stable")
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(_rows, "GROUP_PAIRS_COMPILED_MIN", 0)
    got_keys, got_values, cuts = group_pairs(keys, values, bounds, parts)
    np.testing.assert_array_equal(got_keys, keys[order])
    np.testing.assert_array_equal(got_values, values[order])
    np.testing.assert_array_equal(cuts, np.concatenate([[0], np.cumsum(
        np.bincount(owner, minlength=parts))]))

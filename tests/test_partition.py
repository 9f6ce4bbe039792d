"""Row partitions cover all rows disjointly and balance what they promise to balance."""
import numpy as np
import pytest

from hisparse.errors import LayoutError
from hisparse.partition import group_by_owner, nnz_balanced_blocks, partition_rows, row_modulo


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

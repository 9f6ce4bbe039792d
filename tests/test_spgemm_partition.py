"""SpGEMM's ``flops_balanced`` partition (issue 33): A's rows balanced by their work (intermediate
products plus an output bound), the heaviest rows dealt on their own; ``auto`` takes it on
skewed inputs. The split must lower the flop imbalance below the nnz- and row-balanced splits
on an R-MAT matrix, be the same whether one rank or every rank computes it, and C must still
equal SciPy's product at 1-4 ranks."""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.formats import CSRMatrix
from hisparse.ops.spgemm.op import AUTO_IMBALANCE, choose_split, row_products, row_work
from hisparse.parallel import AllReduce, get_world
from hisparse.partition import (HEAVY_FACTOR, equal_blocks, nnz_balanced_blocks, parts_work,
                                work_imbalance, work_owners)

from helpers import run_config
from test_spgemm import _assert_matches, _c_of, _config, _power_law, _write_inputs


def _rmat_work(scale=13, edge_factor=4, seed=1):
    """R-MAT A (ids permuted, as the generator makes them), its products for A A and work."""
    a = generators.rmat(scale, edge_factor, seed=seed)
    products = row_products(a, a)
    return a, products, row_work(products, a.ncols)


def _flop_imbalance(owners, products, nparts):
    return work_imbalance(parts_work(owners, products, nparts))


@pytest.mark.parametrize("nparts", [2, 3, 4, 8])
def test_flops_balanced_beats_nnz_and_row_splits_on_rmat(nparts):
    """Lower flop imbalance than the nnz-balanced blocks and row-modulo, each part's work within
    one light row of the mean, every row owned once, and the heaviest rows spread: no part holds more
    than its share of the top rows' work plus one of them."""
    a, products, work = _rmat_work()
    rows = np.arange(a.nrows, dtype=np.int64)
    owners, per_part, heavy = work_owners(rows, work, a.nrows, nparts)
    assert owners.shape == rows.shape and owners.min() == 0 and owners.max() == nparts - 1
    np.testing.assert_array_equal(per_part, parts_work(owners, work, nparts))
    assert per_part.sum() == work.sum() and heavy > 0
    bounds = nnz_balanced_blocks(a.indptr, nparts)
    nnz_owners = np.searchsorted(bounds, rows, side="right") - 1
    ours = _flop_imbalance(owners, products, nparts)
    assert ours < _flop_imbalance(nnz_owners, products, nparts)
    assert ours < _flop_imbalance(rows % nparts, products, nparts)
    light = work[work <= HEAVY_FACTOR * work.mean()]
    assert per_part.max() <= per_part.mean() + light.max() and work_imbalance(per_part) < 1.02
    top = np.argsort(work, kind="stable")[::-1][:8 * nparts]
    top_parts = parts_work(owners[top], work[top], nparts)
    assert top_parts.max() <= work[top].sum() / nparts + work[top].max()


def test_heavy_rows_are_dealt_and_a_tiny_input_still_gives_every_part_a_row():
    """A few rows holding nearly all the work: dealt one to each part; with more parts than
    light rows can fill, every part still gets a row and every row one owner."""
    work = np.ones(200, dtype=np.int64)
    work[[3, 17, 29]] = 100_000  # contiguous cuts would give part 0 two of them
    owners, per_part, heavy = work_owners(np.arange(200), work, 200, 3)
    assert heavy == 3 and sorted(owners[[3, 17, 29]]) == [0, 1, 2]
    assert work_imbalance(per_part) < 1.01
    work = np.array([1, 1, 500, 1, 1], dtype=np.int64)
    for nparts in (2, 3, 4, 5):
        owners, per_part, _ = work_owners(np.arange(5), work, 5, nparts)
        assert np.all(np.bincount(owners, minlength=nparts) >= 1)
        assert per_part.sum() == work.sum()
    # One part's chunk would hold only a row dealt to another part: the rows are cut by chunks
    # alone.
    work = np.array([3, 3, 3, 3, 3, 2, 3, 3, 1, 1, 1, 2, 2, 2, 113, 5086, 3, 2, 2, 2, 1, 2, 2, 2,
                     2, 2, 2, 1, 2, 1, 3, 3, 3], dtype=np.int64)
    owners, per_part, heavy = work_owners(np.arange(33), work, 33, 6)
    assert heavy == 0 and np.all(np.bincount(owners, minlength=6) >= 1)
    assert np.all(np.diff(owners) >= 0) and per_part.sum() == work.sum()


def test_auto_takes_flops_balanced_only_on_skewed_rows():
    """A stencil-like A (every row alike) stays in its row blocks under ``auto``; R-MAT moves
    to ``flops_balanced``, recording the blocks' imbalance; one rank never moves."""
    _, _, work = _rmat_work(scale=11)
    n = len(work)
    rows = np.arange(n, dtype=np.int64)
    split = choose_split("row_blocks", True, rows, work, n, 4)
    assert split.strategy == "flops_balanced" and split.owners is not None
    assert split.heavy_rows > 0 and split.held_imbalance > work_imbalance(split.work)
    even = np.full(n, 55, dtype=np.int64)
    split = choose_split("row_blocks", True, rows, even, n, 4)
    assert split.strategy == "row_blocks" and split.owners is None
    assert split.held_imbalance == pytest.approx(1.0, abs=1e-3)
    np.testing.assert_array_equal(split.work, np.diff(equal_blocks(n, 4)) * 55)
    # Blocks whose work is uneven (the first quarter's rows twice as heavy) move, though no row
    # is heavy.
    ramp = np.where(rows < n // 4, 110, 55).astype(np.int64)
    split = choose_split("row_blocks", True, rows, ramp, n, 4)
    assert split.strategy == "flops_balanced" and split.heavy_rows == 0
    assert split.held_imbalance > AUTO_IMBALANCE >= work_imbalance(split.work)
    assert work.max() > HEAVY_FACTOR * work.mean()
    assert choose_split("row_blocks", True, rows, work, n, 1).owners is None
    split = choose_split("row_modulo", False, rows, work, n, 4)
    assert split.strategy == "row_modulo"
    np.testing.assert_array_equal(split.work, np.bincount(rows % 4, weights=work, minlength=4))


@pytest.mark.parallel(nprocs=[2, 3, 4])
def test_owners_found_by_the_ranks_are_rank0s(nprocs):
    """Every rank holding some rows (row-modulo, or ragged blocks) finds, with an all-reduce and
    an all-gather, the owners one holder of every row finds."""
    comm = get_world()
    _, _, work = _rmat_work(scale=11, seed=3)
    n = len(work)
    whole, whole_parts, whole_heavy = work_owners(np.arange(n), work, n, comm.size)
    reduce = AllReduce(comm, "sum")
    ok = True
    cuts = np.sort(np.random.default_rng(4).choice(np.arange(1, n), comm.size - 1,
                                                   replace=False))
    layouts = {"modulo": np.arange(comm.rank, n, comm.size),
               "blocks": np.split(np.arange(n), cuts)[comm.rank]}
    for rows in layouts.values():
        owners, per_part, heavy = work_owners(rows, work[rows], n, comm.size,
                                              lambda x: reduce(np.ascontiguousarray(x)),
                                              comm.allgather)
        ok = ok and np.array_equal(owners, whole[rows]) and heavy == whole_heavy
        ok = ok and np.array_equal(per_part, whole_parts)
    assert all(comm.allgather(bool(ok)))


@pytest.mark.parametrize("strategy,nprocs,precision", [
    ("flops_balanced", 1, "fp64"), ("flops_balanced", 2, "fp32"), ("flops_balanced", 3, "fp64"),
    ("auto", 4, "fp64"), ("flops_balanced", 4, "fp32")])
def test_cpu_power_law_c_with_flops_balanced(tmp_path, strategy, nprocs, precision):
    """C = A A on a power-law A equals SciPy's (from the values in the run's precision) and the
    results record every rank's flops (summing to the run's) and the split's imbalance, below
    row-modulo's where ``auto`` weighed it."""
    a = _power_law()
    config = _config(tmp_path, _write_inputs(tmp_path, a), backend="cpu", precision=precision,
                     partition={"strategy": strategy})
    run, arrays = run_config(tmp_path, config, nprocs)
    attrs = run["attrs"]
    assert attrs["verify_passed"] and attrs["nranks"] == nprocs
    assert attrs["partition"] == ("flops_balanced" if nprocs > 1 or strategy != "auto"
                                  else "row_blocks")
    if precision == "fp32":
        a = a.astype(np.float32).astype(np.float64)
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12 if precision == "fp64" else 1e-5)
    flops = [int(f) for f in attrs["partition_rank_flops"].split(",")]
    assert flops == [int(f) for f in run["rank_vars"]["flops"]]
    assert sum(flops) == attrs["flops"]
    assert attrs["partition_flops_imbalance"] == pytest.approx(work_imbalance(flops))
    if strategy == "auto":
        assert attrs["partition_read_work_imbalance"] > attrs["partition_work_imbalance"]


def test_row_work_counts_products_output_bound_and_the_row():
    a = CSRMatrix.from_scipy(sp.csr_matrix(np.array([[1.0, 1, 0], [0, 0, 0], [0, 1, 1]])))
    b = CSRMatrix.from_scipy(sp.csr_matrix(np.array([[1.0, 1, 1], [1, 0, 0], [0, 1, 1]])))
    products = row_products(a, b)
    np.testing.assert_array_equal(products, [4, 0, 3])
    np.testing.assert_array_equal(row_work(products, b.ncols), [4 + 3 + 1, 1, 3 + 3 + 1])

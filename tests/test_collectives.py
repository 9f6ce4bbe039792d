"""Planned collectives of hisparse.parallel against NumPy, on 1, 2 and 4 ranks."""
import numpy as np
import pytest

from hisparse.parallel import AllReduce, RowAllGather, RowGather, get_world


def _agree(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.parallel(nprocs=[2, 4])
def test_row_allgather_fills_every_block(nprocs):
    comm = get_world()
    rng = np.random.default_rng(7)
    counts = rng.integers(0, 9, size=comm.size)  # some ranks own no rows
    offsets = np.concatenate([[0], np.cumsum(counts)[:-1]])
    width = 3
    expected = rng.standard_normal((int(counts.sum()), width))
    full = np.zeros_like(expected)
    lo, n = int(offsets[comm.rank]), int(counts[comm.rank])
    full[lo:lo + n] = expected[lo:lo + n]
    RowAllGather(comm, lo, n, width)(full)
    assert _agree(comm, np.array_equal(full, expected))


@pytest.mark.parallel(nprocs=[2, 4])
def test_allreduce_sums_in_place(nprocs):
    comm = get_world()
    local = np.full((2, 2), comm.rank + 1.0)
    AllReduce(comm)(local)
    total = comm.size * (comm.size + 1) / 2
    assert _agree(comm, np.all(local == total) and AllReduce(comm, "max").scalar(comm.rank)
                  == comm.size - 1)


@pytest.mark.parallel(nprocs=[2, 4])
def test_row_gather_puts_rows_in_global_order(nprocs):
    comm = get_world()
    n = 23
    rows = np.arange(comm.rank, n, comm.size)  # row-modulo ownership
    values = np.stack([rows * 10.0, -rows], axis=1)
    gathered = RowGather(comm, rows, n)(values)
    if comm.rank == 0:
        ok = np.array_equal(gathered, np.stack([np.arange(n) * 10.0, -np.arange(n)], axis=1))
    else:
        ok = gathered is None
    assert _agree(comm, ok)


def test_single_rank_collectives_are_identity():
    comm = get_world()
    full = np.arange(6.0).reshape(3, 2)
    assert RowAllGather(comm, 0, 3, 2)(full) is full
    rows = np.array([2, 0, 1])
    out = RowGather(comm, rows, 3)(np.array([20.0, 0.0, 10.0]))
    assert np.array_equal(out, [0.0, 10.0, 20.0])

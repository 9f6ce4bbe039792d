"""CP-ALS gives the same answer at every rank count, for every way of starting (issue 35 item 1):
``init: nvecs`` (the whole tensor's leading singular vectors, computed on rank 0), ``random``
(from run.seed), a factor file and a resumed checkpoint, with both row partitions, at 1 to 4
ranks, against the dense oracle of tests/test_cpals.py and the one-rank run."""
import h5py
import numpy as np
import pytest

from hisparse.ops.cpals.init import nvecs_factors
from hisparse.ops.cpals.layout import UnfoldingBlocks, mode_unfolding, partition_mode

from test_cpals import (PROBLEMS, config, make_engine, oracle_cp_als, params_for, run_fits,
                        sparse_tensor, write_problem)
from conftest import run_hisparse
from helpers import run_config


def svd_start(dense, rank):
    """The leading left singular vectors of every unfolding of ``dense`` (LAPACK's SVD)."""
    start = []
    for n in range(dense.ndim):
        unfolding = np.moveaxis(dense, n, 0).reshape(dense.shape[n], -1)
        start.append(np.linalg.svd(unfolding, full_matrices=False)[0][:, :rank])
    return start


@pytest.mark.parametrize("dims,nnz,rank", [PROBLEMS[3], ([2100, 6, 5], 4000, 3)])
def test_nvecs_start_is_c_ordered_signed_and_the_singular_vectors(dims, nnz, rank):
    """The start is what the engines' in-place row all-gathers can fill (C order: a
    Fortran-ordered start made the gathers at several ranks land in a discarded copy), the
    leading singular vectors up to sign, each column's largest-magnitude entry positive, and the
    same bits when computed again (a mode of 2100 rows takes ARPACK's path, whose default start
    is random)."""
    tensor, dense = sparse_tensor(dims, nnz, seed=5)
    factors = nvecs_factors(tensor, rank)
    again = nvecs_factors(tensor, rank)
    for factor, left, other in zip(factors, svd_start(dense, rank), again):
        assert factor.flags.c_contiguous and factor.shape == left.shape
        np.testing.assert_array_equal(factor, other)
        biggest = np.argmax(np.abs(factor), axis=0)
        assert np.all(factor[biggest, np.arange(rank)] > 0)
        np.testing.assert_allclose(np.abs(factor.T @ left), np.eye(rank), atol=1e-10)


def test_cpu_engine_keeps_a_fortran_ordered_start_in_c_order():
    """The row all-gather fills ``factor_buffer(n)`` in place as one flat array: the engine
    holds its factors C-ordered whatever layout the start came in."""
    dims, nnz, rank = PROBLEMS[3]
    tensor, _ = sparse_tensor(dims, nnz, seed=5)
    local = UnfoldingBlocks(tuple(dims), [partition_mode(mode_unfolding(tensor, n, np.int32), 2,
                                                         "nnz_balanced")[0] for n in range(3)])
    engine = make_engine("cpu", "fast", local, rank, np.float64)
    start = [np.asfortranarray(np.random.default_rng(n).uniform(size=(d, rank)))
             for n, d in enumerate(dims)]
    engine.load(start)
    for n, factor in enumerate(start):
        assert engine.factor_buffer(n).flags.c_contiguous
        np.testing.assert_array_equal(engine.factor_buffer(n), factor)


@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_blocks"])
def test_cpals_nvecs_start_gives_the_same_fits_at_1_to_4_ranks(tmp_path, strategy):
    """The nvecs start at 2 or more ranks: every fit follows the dense oracle from the SVD
    start and the one-rank run (before the fix the fits at 2+ ranks departed in the first
    iteration and verification failed)."""
    dims, nnz, rank = PROBLEMS[3]
    dense, _ = write_problem(tmp_path, dims, nnz, rank, seed=5)
    expected, _, _ = oracle_cp_als(dense, svd_start(dense, rank), tol=1e-6, max_iters=40)
    params = params_for(tmp_path, rank, max_iters=40, init="nvecs")
    fits = {}
    for nprocs in (1, 2, 3, 4):
        run, arrays = run_fits(tmp_path, params, nprocs=nprocs, out=f"r{nprocs}",
                               backend="cpu", partition={"strategy": strategy})
        assert run["attrs"]["nranks"] == nprocs and run["attrs"]["verify_passed"]
        np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9,
                                   err_msg=f"{nprocs} ranks")
        fits[nprocs] = arrays["fit"]
    for nprocs in (2, 3, 4):
        assert len(fits[nprocs]) == len(fits[1])
        np.testing.assert_allclose(fits[nprocs], fits[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("init,strategy", [("random", "row_blocks"), ("file", "nnz_balanced")])
def test_cpals_random_and_file_starts_give_the_same_fits_at_3_ranks(tmp_path, init, strategy):
    """The other starts at an odd rank count (uneven blocks), against the one-rank run (2 and 4
    ranks: tests/test_cpals.py and tests/test_cpals_input.py)."""
    dims, nnz, rank = PROBLEMS[4]
    write_problem(tmp_path, dims, nnz, rank, seed=13)
    params = params_for(tmp_path, rank, max_iters=30)
    if init == "random":
        params["init"] = "random"
    fits = {}
    for nprocs in (1, 3):
        run, arrays = run_fits(tmp_path, params, nprocs=nprocs, out=f"r{nprocs}",
                               backend="cpu", partition={"strategy": strategy})
        assert run["attrs"]["verify_passed"]
        fits[nprocs] = arrays["fit"]
    assert len(fits[3]) == len(fits[1]) > 2
    np.testing.assert_allclose(fits[3], fits[1], rtol=0, atol=1e-12)


def test_cpals_resume_at_2_ranks_continues_the_one_rank_run(tmp_path):
    """A checkpoint written at one rank, resumed at two from an nvecs start: the fits continue
    those of the uninterrupted one-rank run."""
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=21)
    base = params_for(tmp_path, rank, tol=1e-7, max_iters=8, init="nvecs")
    _, whole = run_fits(tmp_path, base, out="whole", backend="cpu")
    checkpoint = tmp_path / "ck.h5"
    first = dict(base, max_iters=4, checkpoint_every=4, checkpoint=str(checkpoint))
    proc = run_hisparse(["run", config(tmp_path, first, out="first", backend="cpu"), "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    with h5py.File(checkpoint, "r") as handle:
        assert handle.attrs["iteration"] == 4
    resumed = dict(base, checkpoint=str(checkpoint), resume=True)
    run, arrays = run_config(tmp_path, config(tmp_path, resumed, out="resumed", backend="cpu"),
                             nprocs=2, out="resumed")
    assert run["attrs"]["verify_passed"]
    np.testing.assert_allclose(arrays["fit"], whole["fit"], rtol=0, atol=1e-12)

"""Supernodal Cholesky: symbolic counts against dense elimination (plan), the CPU factorization
and solve against NumPy/SciPy, the GPU engine against the CPU engine on the same plan (engines
agree), error lines, and the driver on CPU and GPU (marker gpu)."""
import os
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from hisparse import generators
from hisparse.config import config_from_dict
from hisparse.context import RunContext
from hisparse.errors import HisparseError
from hisparse.formats import CSRMatrix
from hisparse.gpu import type_defines
from hisparse.io import write_matrix
from hisparse.ops.cholesky import Cholesky, CholeskyLocal
from hisparse.ops.cholesky.cpu import (NotPositiveDefinite, factor_cpu, factor_to_sparse, logdet,
                                       solve_cpu)
from hisparse.ops.cholesky.gpu import KERNELS, SMEM_BYTES
from hisparse.ops.cholesky.symbolic import analyze, check_square_symmetric, have_pymetis
from hisparse.timing import PhaseTimer

from helpers import config_dict, run_config, write_config

DATA = Path(os.environ.get("HISPARSE_SHARED_DATA", Path(__file__).resolve().parents[2]
                           / "shared" / "data" / "matrices" / "spd"))
ORDERINGS = ["natural", "rcm"] + (["metis"] if have_pymetis() else [])

# SIAM 100-digit challenge problem 7 (published): inv(A)(1,1) of Trefethen_20000, and the
# log-determinant measured with CHOLMOD (reference notes).
TREFETHEN_20000_INV11 = 0.72507834626840116746868771925116
TREFETHEN_20000_LOGDET = 2.2424561044e5


def _random_spd(n, density, seed):
    rng = np.random.default_rng(seed)
    b = sp.random(n, n, density=density, random_state=rng, format="csr")
    a = b + b.T
    a = a + sp.diags(np.asarray(abs(a).sum(axis=1)).ravel() + 1.0)
    return sp.csr_matrix(a)


def _structural_factor_count(dense):
    """nnz of the Cholesky factor's pattern by symbolic dense elimination (no cancellation)."""
    pattern = dense != 0
    n = len(pattern)
    for k in range(n):
        rows = np.flatnonzero(pattern[k + 1:, k]) + k + 1
        pattern[np.ix_(rows, rows)] = True
    return pattern


def _backward_error(a, x, b):
    r = np.abs(b - a @ x)
    return float((r / (abs(a) @ np.abs(x) + np.abs(b))).max())


def _unpermute(sym, x_perm):
    """The solution in the original numbering (row perm[j] of x is row j of x_perm)."""
    x = np.empty_like(x_perm)
    x[sym.perm] = x_perm
    return x


def _solve_with(sym, values, b):
    """Factor A's ``values`` on the plan ``sym`` and solve for ``b`` (original numbering)."""
    lx = factor_cpu(sym, values)
    return lx, _unpermute(sym, solve_cpu(sym, lx, b[sym.perm]))


def _solve(a, b, **kw):
    sym = analyze(a, **kw)
    lx, x = _solve_with(sym, a.data, b)
    return sym, lx, x


# -- symbolic -------------------------------------------------------------------------------
@pytest.mark.parametrize("ordering", ORDERINGS)
@pytest.mark.parametrize("make", [lambda: generators.poisson([9, 11]).to_scipy(),
                                  lambda: _random_spd(70, 0.05, 1),
                                  lambda: generators.trefethen(60).to_scipy()])
def test_symbolic_counts_match_dense_elimination(make, ordering):
    a = make()
    sym = analyze(a, ordering=ordering, relaxation="none")
    permuted = a[sym.perm][:, sym.perm].toarray()
    pattern = _structural_factor_count(permuted)
    lower = np.tril(pattern)
    assert sym.factor_nnz == int(lower.sum())
    np.testing.assert_array_equal(sym.counts, lower.sum(axis=0))
    # elimination tree: parent[j] = first off-diagonal row of column j of L
    for j in range(a.shape[0]):
        below = np.flatnonzero(lower[j + 1:, j])
        assert sym.parent[j] == (j + 1 + below[0] if len(below) else -1)
    # without relaxation the supernodal storage holds exactly the factor
    assert sym.supernodal_nnz == sym.factor_nnz
    # the permutation is a permutation, and the postorder keeps children before parents
    assert sorted(sym.perm.tolist()) == list(range(a.shape[0]))
    assert np.all((sym.parent > np.arange(a.shape[0])) | (sym.parent == -1))


@pytest.mark.parametrize("relaxation", ["threshold", "cholmod"])
def test_relaxed_supernodes_cover_the_factor(relaxation):
    a = generators.poisson([10, 9, 8]).to_scipy()
    exact = analyze(a, ordering="rcm", relaxation="none")
    relaxed = analyze(a, ordering="rcm", relaxation=relaxation, merge_threshold=16)
    assert relaxed.factor_nnz == exact.factor_nnz
    assert relaxed.nsuper < exact.nsuper
    assert relaxed.supernodal_nnz >= relaxed.factor_nnz
    # every exact column pattern is inside its relaxed supernode's rows
    lower = sp.tril(factor_to_sparse(exact, factor_cpu(exact, a.data))).tocsc()
    for s in range(relaxed.nsuper):
        rows = set(relaxed.supernode_rows(s).tolist())
        for j in range(relaxed.starts[s], relaxed.starts[s + 1]):
            col = lower.indices[lower.indptr[j]:lower.indptr[j + 1]]
            assert set(col.tolist()) <= rows
    if relaxation == "threshold":
        assert np.diff(relaxed.starts).max() >= 16 or relaxed.nsuper == 1


def test_block_split_of_large_supernodes():
    a = generators.trefethen(300).to_scipy()
    sym = analyze(a, ordering="rcm", relaxation="cholmod", block_size=32)
    for s in range(sym.nsuper):
        blocks = sym.column_blocks(s)
        assert blocks[0] == 0 and blocks[-1] == sym.starts[s + 1] - sym.starts[s]
        assert np.diff(blocks).max() <= 32


# -- numeric (CPU) --------------------------------------------------------------------------
@pytest.mark.parametrize("relaxation", ["none", "threshold", "cholmod"])
@pytest.mark.parametrize("make", [lambda: generators.poisson([23, 19]).to_scipy(),
                                  lambda: generators.poisson([9, 8, 7]).to_scipy(),
                                  lambda: generators.poisson([6, 7, 5], stencil=27).to_scipy()])
def test_cpu_factor_and_solve(make, relaxation):
    a = make()
    rng = np.random.default_rng(4)
    b = a @ rng.uniform(-1, 1, (a.shape[0], 3))
    sym, lx, x = _solve(a, b, relaxation=relaxation, merge_threshold=8)
    lower = factor_to_sparse(sym, lx)
    permuted = a[sym.perm][:, sym.perm]
    assert abs(lower @ lower.T - permuted).max() <= 1e-12 * abs(a).max()
    assert _backward_error(a, x, b) <= 1e-12
    sign, expected = np.linalg.slogdet(a.toarray())
    assert sign == 1 and logdet(sym, lx) == pytest.approx(expected, rel=1e-12)


def test_trefethen_2000_logdet_and_inverse_entry():
    a = generators.trefethen(2000).to_scipy()
    dense = a.toarray()
    e0 = np.zeros((2000, 1))
    e0[0] = 1.0
    sym, lx, x = _solve(a, e0)
    assert x[0, 0] == pytest.approx(np.linalg.inv(dense)[0, 0], rel=1e-13)
    assert logdet(sym, lx) == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-13)
    b = a @ np.random.default_rng(0).uniform(-1, 1, (2000, 2))
    assert _backward_error(a, _solve(a, b)[2], b) <= 1e-12
    # log det of the (1,1) minor minus log det A = log inv(A)(1,1)
    minor = a[1:, 1:].tocsr()
    sym_b = analyze(minor)
    assert np.exp(logdet(sym_b, factor_cpu(sym_b, minor.data)) - logdet(sym, lx)) == \
        pytest.approx(x[0, 0], rel=1e-10)


def test_refactorization_reuses_the_analysis():
    a = generators.poisson([15, 16]).to_scipy()
    sym = analyze(a)
    rng = np.random.default_rng(2)
    # same pattern, new values: a + diag shift and scaled off-diagonals
    new = a.copy()
    new.data = np.where(new.indices == np.repeat(np.arange(a.shape[0]), np.diff(a.indptr)),
                        new.data + rng.uniform(0.5, 2.0, new.nnz), new.data * 0.7)
    b = rng.uniform(-1, 1, (a.shape[0], 1))
    _lx, x = _solve_with(sym, new.data, b)
    np.testing.assert_allclose(x, spl.spsolve(new.tocsc(), b).reshape(-1, 1), rtol=1e-10,
                               atol=1e-12)


def test_unsorted_csr_input_maps_values_correctly():
    a = generators.poisson([7, 8]).to_scipy()
    rng = np.random.default_rng(0)
    shuffled = a.copy()
    for i in range(a.shape[0]):  # reverse every row's entries
        lo, hi = a.indptr[i], a.indptr[i + 1]
        shuffled.indices[lo:hi] = a.indices[lo:hi][::-1]
        shuffled.data[lo:hi] = a.data[lo:hi][::-1]
    shuffled.has_sorted_indices = False
    b = rng.uniform(-1, 1, (a.shape[0], 1))
    sym = analyze(shuffled)
    _lx, x = _solve_with(sym, shuffled.data, b)
    assert _backward_error(a, x, b) <= 1e-12


# -- engines agree: the engine picked for a backend against the CPU engine on the same plan -----
ENGINE_BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
ENGINE_CASES = {
    "defaults": {},  # batched small supernodes + block tasks for the rest
    "all-block-tasks": {"small_work": 1.0, "block_size": 48, "nrhs": 3},
    "all-batched": {"small_work": 1e12, "nrhs": 2},
}


@contextmanager
def _engine(tmp_path, backend, local, params):
    """The engine Cholesky picks for ``backend`` on ``local``, in this process as a one-rank run
    without MPI (the GPU bound and the kernels loaded as setup does); freed afterwards."""
    config = config_from_dict(config_dict(tmp_path, "cholesky", params, backend=backend,
                                          input={"generate": {"kind": "poisson",
                                                              "dims": [4, 4]}}))
    device = None
    if backend == "gpu":
        from hisparse.gpu import bind_device
        device = bind_device(0)
    ctx = RunContext(config=config, comm=types.SimpleNamespace(rank=0, size=1), local_comm=None,
                     backend=backend, timer=PhaseTimer(Cholesky.phases()), device=device)
    try:
        if backend == "gpu":
            from hisparse.ops.cholesky.gpu import load_kernels
            local.kernels = load_kernels(ctx)
        engine = Cholesky(ctx).pick_engine(local)
        try:
            yield engine
        finally:
            engine.free()
    finally:
        if device is not None:
            device.release()


@pytest.mark.parametrize("case", list(ENGINE_CASES))
@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_engines_agree_on_the_same_plan(tmp_path, backend, case):
    params = ENGINE_CASES[case]
    a = generators.poisson([12, 11, 10]).to_scipy()
    b = a @ np.random.default_rng(5).uniform(-1, 1, (a.shape[0], params.get("nrhs", 1)))
    sym = analyze(a, relaxation="cholmod", block_size=params.get("block_size", 1024))
    with _engine(tmp_path, backend, CholeskyLocal(sym), params) as engine:
        assert engine.BACKEND == backend
        engine.load(a.data, b)
        det = engine.factor()
        engine.solve()
        x = _unpermute(sym, np.array(engine.solution()))
        lower = factor_to_sparse(sym, engine.factor_values())
        peak = engine.memory_stats()["peak_device_bytes"]
    # the factor: the CPU engine's on the same plan, and L L^T = P A P^T
    reference = factor_to_sparse(sym, factor_cpu(sym, a.data))
    assert abs(lower - reference).max() <= 1e-12 * abs(reference).max()
    assert abs(lower @ lower.T - a[sym.perm][:, sym.perm]).max() <= 1e-12 * abs(a).max()
    np.testing.assert_allclose(x, spl.spsolve(a.tocsc(), b).reshape(x.shape), rtol=1e-10,
                               atol=1e-12)
    assert det == pytest.approx(np.linalg.slogdet(a.toarray())[1], rel=1e-12)
    if backend == "gpu":  # at least the factor's panels were on the device, through the arena
        assert peak >= int(sym.panel_offset[-1]) * 8
    else:
        assert peak == 0


def test_kernel_table_matches_the_launches_validated_on_the_gpu():
    # The signatures typed by hand beside each prepare() before the table, checked on the H100.
    assert KERNELS.signatures(type_defines(np.float64, np.int32, SMEM_BYTES=SMEM_BYTES)) == {
        "assemble": "qPPPP", "factor_small": "iPPPPPPPPPP", "scatter_update": "iiiPiPPPP",
        "record_potrf_info": "PiP", "gather_diag": "iPPP", "forward_small": "iPPPPPPPiiP",
        "backward_small": "iPPPPPPPiiP", "sub_rows": "iiPiPPi", "gather_rows": "iiPPiPi"}


# -- errors ---------------------------------------------------------------------------------
def test_non_square_and_non_symmetric_raise_one_line():
    with pytest.raises(HisparseError, match="not square"):
        check_square_symmetric(sp.csr_matrix(np.ones((3, 4))))
    bad = generators.poisson([4, 4]).to_scipy().tolil()
    bad[2, 7] = 5.0
    with pytest.raises(HisparseError, match=r"not symmetric: A\[2, 7\]"):
        check_square_symmetric(bad.tocsr())


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_indefinite_matrix_names_the_original_column(ordering):
    a = generators.poisson([8, 9]).to_scipy().tolil()
    a[37, 37] = -1.0  # diagonally dominant elsewhere: only this pivot can fail
    a = a.tocsr()
    sym = analyze(a, ordering=ordering)
    with pytest.raises(NotPositiveDefinite, match=r"pivot of column 37 \(original") as info:
        factor_cpu(sym, a.data)
    assert info.value.column == 37
    assert sym.perm[info.value.permuted_column] == 37


def test_singular_matrix_raises():
    # rows/columns 3 and 11 are identical 2x2 blocks [[1, 1], [1, 1]]: an exact zero pivot
    a = sp.lil_matrix(np.eye(16) * 4.0)
    a[3, 3] = a[11, 11] = a[3, 11] = a[11, 3] = 1.0
    a = a.tocsr()
    sym = analyze(a, ordering="natural")
    with pytest.raises(NotPositiveDefinite) as info:
        factor_cpu(sym, a.data)
    assert info.value.column in (3, 11)


# -- driver ---------------------------------------------------------------------------------
def _matrix_input(tmp_path, matrix):
    """The ``input`` section reading ``matrix`` (a CSRMatrix) from an HDF5 file in tmp_path."""
    path = tmp_path / "a.h5"
    write_matrix(path, matrix)
    return {"path": str(path)}


def _indefinite_laplacian(grid, column, value):
    """A 2-D Laplacian whose ``column``'s diagonal is ``value`` < 0 (only that pivot fails)."""
    a = generators.poisson(grid).to_scipy().tolil()
    a[column, column] = value
    return CSRMatrix.from_scipy(a.tocsr(), symmetric=True)


def _run(tmp_path, input, backend="cpu", expect_rc=0, gpu=None, **params):
    """Run Cholesky with ``params`` on one rank: ``(run, /result arrays)``, or the finished
    process when ``expect_rc`` is not 0."""
    sections = {"gpu": gpu} if gpu else {}
    cfg = write_config(tmp_path, "cholesky", params, input=input, backend=backend, **sections)
    return run_config(tmp_path, cfg, expect_rc=expect_rc)


def test_driver_cpu_solves_and_records(tmp_path):
    a = generators.poisson([14, 15])
    run, arrays = _run(tmp_path, _matrix_input(tmp_path, a), nrhs=3)
    x, b = arrays["x"], arrays["b"]
    assert run["attrs"]["verify_passed"]
    matrix = a.to_scipy()
    np.testing.assert_allclose(x, spl.spsolve(matrix.tocsc(), b), rtol=1e-10, atol=1e-12)
    assert run["attrs"]["chol_factor_nnz"] > 0
    assert run["attrs"]["flops"] == pytest.approx(run["attrs"]["chol_factor_flops"])
    # the CPU engine moves no data: its transfer phases are not recorded
    kinds = run["phase_kinds"]
    assert kinds["numeric"] == "compute" and kinds["h2d"] == kinds["upload"] == "transfer"
    wall = run["wall"][:, 0, :]
    assert np.isnan(wall[:, run["phases"].index("h2d")]).all()
    assert np.isfinite(wall[:, run["phases"].index("numeric")]).all()
    assert int(run["rank_vars"]["peak_device_bytes"][0]) == 0


def test_driver_reports_not_positive_definite(tmp_path):
    proc = _run(tmp_path, _matrix_input(tmp_path, _indefinite_laplacian([6, 6], 20, -2.0)),
                expect_rc=2)
    assert "not positive definite" in proc.stderr and "column 20" in proc.stderr


# -- optional: SuiteSparse matrices from ../shared/data -------------------------------------
def _load_shared(name):
    import scipy.io
    path = DATA / name
    if not path.exists():
        pytest.skip(f"{path} not present")
    if name.endswith(".txt.gz"):
        t = np.loadtxt(path)
        a = sp.coo_matrix((t[:, 2], (t[:, 0].astype(int), t[:, 1].astype(int)))).tocsr()
        return (a + sp.tril(a, -1).T).tocsr()
    return sp.csr_matrix(scipy.io.mmread(str(path)))


@pytest.mark.parametrize("name", ["bcsstk02.mtx", "bcsstk21.mtx", "1138_bus.mtx",
                                  "bcsstk13.mtx.gz"])
def test_shared_spd_matrices_cpu(name):
    a = _load_shared(name)
    a.sort_indices()
    b = a @ np.random.default_rng(1).uniform(-1, 1, (a.shape[0], 1))
    _sym, _lx, x = _solve(a, b)
    assert _backward_error(a, x, b) <= 1e-12


# -- GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("grid,params", [
    ([40, 41], {}),  # defaults: batched small supernodes + block tasks for the rest
    ([14, 13, 12], {}),
    ([14, 13, 12], {"small_work": 1.0, "block_size": 48, "nrhs": 3}),  # all as block tasks
    ([40, 41], {"small_work": 1e12, "nrhs": 2}),  # every supernode in the batched kernel
    ([14, 13, 12], {"relaxation": "none"}),
])
def test_gpu_solves_laplacians(tmp_path, grid, params):
    matrix = generators.poisson(grid)
    run, arrays = _run(tmp_path, _matrix_input(tmp_path, matrix), backend="gpu", **params)
    x, b = arrays["x"], arrays["b"]
    a = matrix.to_scipy()
    assert _backward_error(a, x, b) <= 1e-12
    sign, expected = np.linalg.slogdet(a.toarray()) if a.shape[0] <= 2000 else (1, None)
    if expected is not None:
        assert run["attrs"]["chol_logdet"] == pytest.approx(expected, rel=1e-11)
    # the factor's panels at least went through the engine's arena
    item = np.dtype(np.float64).itemsize
    assert int(run["rank_vars"]["peak_device_bytes"][0]) >= \
        int(run["attrs"]["chol_supernodal_nnz"]) * item


@pytest.mark.gpu
@pytest.mark.parametrize("streams,block_size", [(1, 1024), (4, 128)])
def test_gpu_trefethen_2000(tmp_path, streams, block_size):
    run, arrays = _run(tmp_path, {"generate": {"kind": "trefethen", "n": 2000}}, backend="gpu",
                       gpu={"streams": streams}, rhs="unit", block_size=block_size,
                       relaxation="cholmod")
    x = arrays["x"]
    dense = generators.trefethen(2000).to_scipy().toarray()
    assert x[0, 0] == pytest.approx(np.linalg.inv(dense)[0, 0], rel=1e-12)
    assert run["attrs"]["chol_logdet"] == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-12)


@pytest.mark.gpu
def test_gpu_not_positive_definite(tmp_path):
    matrix_input = _matrix_input(tmp_path, _indefinite_laplacian([30, 30], 451, -3.0))
    for small_work in (1.0, 1e12):  # the cuSOLVER path and the batched kernel
        proc = _run(tmp_path, matrix_input, backend="gpu", expect_rc=2, small_work=small_work)
        assert "not positive definite" in proc.stderr and "column 451 " in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("HISPARSE_SLOW") != "1", reason="set HISPARSE_SLOW=1")
def test_gpu_trefethen_20000_published_values(tmp_path):
    run, arrays = _run(tmp_path, {"generate": {"kind": "trefethen", "n": 20000}}, backend="gpu",
                       rhs="unit", relaxation="cholmod")
    assert arrays["x"][0, 0] == pytest.approx(TREFETHEN_20000_INV11, rel=1e-13)
    assert run["attrs"]["chol_logdet"] == pytest.approx(TREFETHEN_20000_LOGDET, rel=1e-10)

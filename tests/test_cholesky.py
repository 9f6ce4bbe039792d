"""Supernodal Cholesky: symbolic counts against dense elimination, the CPU factorization and
solve against NumPy/SciPy, error lines, the driver on CPU, and the GPU engine (marker gpu)."""
import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from hisparse import generators
from hisparse.errors import HisparseError
from hisparse.formats import CSRMatrix
from hisparse.io import read_results, write_matrix
from hisparse.ops._cholesky_numeric import (NotPositiveDefinite, factor_cpu, factor_to_sparse,
                                            logdet, solve_cpu)
from hisparse.ops._cholesky_symbolic import (analyze, check_square_symmetric, have_pymetis)

from conftest import run_hisparse

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


def _solve(a, b, **kw):
    sym = analyze(a, **kw)
    lx = factor_cpu(sym, a.data)
    x_perm = solve_cpu(sym, lx, b[sym.perm])
    x = np.empty_like(x_perm)
    x[sym.perm] = x_perm
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
    lx = factor_cpu(sym, new.data)
    x_perm = solve_cpu(sym, lx, b[sym.perm])
    x = np.empty_like(x_perm)
    x[sym.perm] = x_perm
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
    lx = factor_cpu(sym, shuffled.data)
    x = np.empty_like(b)
    x[sym.perm] = solve_cpu(sym, lx, b[sym.perm])
    assert _backward_error(a, x, b) <= 1e-12


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
def _config(tmp_path, input_line, backend="cpu", **params):
    params = ", ".join(f"{k}: {v}" for k, v in params.items())
    text = "\n".join([
        "run: {name: t, repeats: 2, warmup: 1}",
        f"operation: {{name: cholesky, params: {{{params}}}}}",
        input_line,
        f"output: {{dir: {tmp_path / 'out'}}}",
        f"backend: {backend}",
    ]) + "\n"
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def _result(tmp_path):
    (result_file,) = (tmp_path / "out").glob("*.h5")
    run = read_results(str(result_file))
    with h5py.File(result_file, "r") as handle:
        x = handle["result/x"][()]
        b = handle["result/b"][()]
    return run, x, b


def test_driver_cpu_solves_and_records(tmp_path):
    path = tmp_path / "a.h5"
    a = generators.poisson([14, 15])
    write_matrix(path, a)
    cfg = _config(tmp_path, f"input: {{path: {path}}}", nrhs=3)
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    run, x, b = _result(tmp_path)
    assert run["attrs"]["verify_passed"]
    matrix = a.to_scipy()
    np.testing.assert_allclose(x, spl.spsolve(matrix.tocsc(), b), rtol=1e-10, atol=1e-12)
    assert run["attrs"]["chol_factor_nnz"] > 0
    assert run["attrs"]["flops"] == pytest.approx(run["attrs"]["chol_factor_flops"])


def test_driver_reports_not_positive_definite(tmp_path):
    path = tmp_path / "a.h5"
    a = generators.poisson([6, 6]).to_scipy().tolil()
    a[20, 20] = -2.0
    write_matrix(path, CSRMatrix.from_scipy(a.tocsr(), symmetric=True))
    cfg = _config(tmp_path, f"input: {{path: {path}}}")
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 2
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
    path = tmp_path / "a.h5"
    matrix = generators.poisson(grid)
    write_matrix(path, matrix)
    cfg = _config(tmp_path, f"input: {{path: {path}}}", backend="gpu", **params)
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    run, x, b = _result(tmp_path)
    a = matrix.to_scipy()
    assert _backward_error(a, x, b) <= 1e-12
    sign, expected = np.linalg.slogdet(a.toarray()) if a.shape[0] <= 2000 else (1, None)
    if expected is not None:
        assert run["attrs"]["chol_logdet"] == pytest.approx(expected, rel=1e-11)


@pytest.mark.gpu
@pytest.mark.parametrize("streams,block_size", [(1, 1024), (4, 128)])
def test_gpu_trefethen_2000(tmp_path, streams, block_size):
    cfg = _config(tmp_path, "input: {generate: {kind: trefethen, n: 2000}}", backend="gpu",
                  rhs="unit", block_size=block_size, relaxation="cholmod")
    proc = run_hisparse(["run", cfg, "--quiet", "--set", f"gpu.streams={streams}"])
    assert proc.returncode == 0, proc.stderr
    run, x, b = _result(tmp_path)
    dense = generators.trefethen(2000).to_scipy().toarray()
    assert x[0, 0] == pytest.approx(np.linalg.inv(dense)[0, 0], rel=1e-12)
    assert run["attrs"]["chol_logdet"] == pytest.approx(np.linalg.slogdet(dense)[1], rel=1e-12)


@pytest.mark.gpu
def test_gpu_not_positive_definite(tmp_path):
    path = tmp_path / "a.h5"
    a = generators.poisson([30, 30]).to_scipy().tolil()
    a[451, 451] = -3.0
    write_matrix(path, CSRMatrix.from_scipy(a.tocsr(), symmetric=True))
    for small_work in (1.0, 1e12):  # the cuSOLVER path and the batched kernel
        cfg = _config(tmp_path, f"input: {{path: {path}}}", backend="gpu", small_work=small_work)
        proc = run_hisparse(["run", cfg, "--quiet"])
        assert proc.returncode == 2, proc.stderr
        assert "not positive definite" in proc.stderr and "column 451 " in proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get("HISPARSE_SLOW") != "1", reason="set HISPARSE_SLOW=1")
def test_gpu_trefethen_20000_published_values(tmp_path):
    cfg = _config(tmp_path, "input: {generate: {kind: trefethen, n: 20000}}", backend="gpu",
                  rhs="unit", relaxation="cholmod")
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr
    run, x, _b = _result(tmp_path)
    assert x[0, 0] == pytest.approx(TREFETHEN_20000_INV11, rel=1e-13)
    assert run["attrs"]["chol_logdet"] == pytest.approx(TREFETHEN_20000_LOGDET, rel=1e-10)

"""SpGEMM (C = A B, A A): results against SciPy on one and several ranks, CPU and GPU.

Every run stores C under /result; the tests rebuild it and compare with a SciPy product written
plainly here: identical structure (row pointers and sorted columns) and values within
1e-12 * (|A| |B|)_ij for fp64 (the bound of any summation order).
"""
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.formats import CSRMatrix
from hisparse.io import read_results, write_matrix
from hisparse.ops.spgemm import assemble_rows, row_products

from conftest import run_hisparse


# -- inputs ------------------------------------------------------------------------------------
def _random_csr(rng, shape, lengths, col_low=0, col_high=None):
    """Rows with the given lengths at distinct random columns in [col_low, col_high)."""
    col_high = shape[1] if col_high is None else col_high
    rows = np.repeat(np.arange(shape[0]), lengths)
    cols = np.concatenate([rng.choice(np.arange(col_low, col_high), size=k, replace=False)
                           for k in lengths]) if lengths.sum() else np.zeros(0, int)
    return sp.csr_matrix((rng.standard_normal(len(rows)), (rows, cols)), shape=shape)


def _rectangular_pair(seed=5):
    """A (310 x 200) and B (200 x 260): empty rows at the ends and in a run, empty columns,
    one long row in each."""
    rng = np.random.default_rng(seed)
    a_lengths = rng.integers(0, 9, size=310)
    a_lengths[:4] = 0
    a_lengths[-6:] = 0
    a_lengths[120:150] = 0
    a_lengths[77] = 150
    a = _random_csr(rng, (310, 200), a_lengths, 0, 180)  # columns 180.. of A empty
    b_lengths = rng.integers(0, 12, size=200)
    b_lengths[10:20] = 0
    b_lengths[33] = 240
    b = _random_csr(rng, (200, 260), b_lengths, 0, 250)  # columns 250.. of B empty
    return a, b


def _duplicate_heavy_pair(seed=6):
    """Every output entry gathers about 15 products."""
    rng = np.random.default_rng(seed)
    a = _random_csr(rng, (180, 50), np.full(180, 30))
    b = _random_csr(rng, (50, 40), np.full(50, 20))
    return a, b


def _power_law(seed=7, n=1500):
    """A power-law (R-MAT-like) square matrix with random values."""
    from hisparse import generators
    graph = generators.rmat(int(np.log2(n)) + 1, edge_factor=6, seed=seed).to_scipy()
    graph = graph[:n, :n].tocsr()
    graph.data = np.random.default_rng(seed).standard_normal(graph.nnz)
    return graph


def _long_row_pair(seed=8):
    """Rows whose output (about 16k and 45k columns) exceeds the largest shared-memory tables."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 20, size=24)
    lengths[3] = 600    # ~24k products over 30k columns -> ~16k outputs (numeric: global table)
    lengths[11] = 1500  # ~60k products over 100k columns -> ~45k outputs (symbolic overflow too)
    a = sp.lil_matrix((24, 2000))
    for row, k in enumerate(lengths):
        span = 750 if row == 3 else 2000  # B rows < 750 only reach columns < 30000
        a[row, rng.choice(span, size=min(k, span), replace=False)] = rng.standard_normal(
            min(k, span))
    b_rows = np.repeat(np.arange(2000), 40)
    b_cols = np.where(b_rows < 750, rng.integers(0, 30000, size=len(b_rows)),
                      rng.integers(0, 100000, size=len(b_rows)))
    b = sp.csr_matrix((rng.standard_normal(len(b_rows)), (b_rows, b_cols)), shape=(2000, 100000))
    return a.tocsr(), b


def _write(path, matrix):
    write_matrix(path, CSRMatrix.from_scipy(matrix))


def _config(tmp_path, a_path, b_spec="same", params=None, **extra):
    params = dict(params or {})
    params["b"] = b_spec
    text = ", ".join(f"{k}: {v}" for k, v in params.items())
    lines = ["run: {name: t, repeats: 2, warmup: 1}",
             f"operation: {{name: spgemm, params: {{{text}}}}}",
             f"input: {{path: {a_path}}}",
             f"output: {{dir: {tmp_path / 'out'}}}"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path = tmp_path / "run.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(tmp_path, config, nprocs):
    proc = run_hisparse(["run", config, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result_file,) = (tmp_path / "out").glob("*.h5")
    return result_file, read_results(str(result_file))


def _c_of(result_file, shape):
    with h5py.File(result_file, "r") as handle:
        group = handle["result"]
        return sp.csr_matrix((group["data"][()], group["indices"][()], group["indptr"][()]),
                             shape=shape)


def _assert_matches(c, a, b, rtol):
    """Same structure as SciPy's A @ B (canonical) and values within rtol * (|A||B|)_ij."""
    reference = (a @ b).tocsr()
    reference.sum_duplicates()
    reference.sort_indices()
    bound = (abs(a) @ abs(b)).tocsr()
    bound.sort_indices()
    assert c.shape == reference.shape
    np.testing.assert_array_equal(np.asarray(c.indptr, np.int64), reference.indptr)
    np.testing.assert_array_equal(c.indices, reference.indices)
    assert np.array_equal(bound.indptr, reference.indptr)  # no exact cancellation in the inputs
    error = np.abs(c.data.astype(np.float64) - reference.data)
    assert np.all(error <= rtol * bound.data), float(np.max(error / bound.data))


# -- pure functions ----------------------------------------------------------------------------
def test_row_products_counts_every_intermediate_product():
    a, b = _rectangular_pair()
    expected = [sum(b[k].nnz for k in a[i].indices) for i in range(a.shape[0])]
    got = row_products(CSRMatrix.from_scipy(a), CSRMatrix.from_scipy(b))
    np.testing.assert_array_equal(got, expected)


def test_assemble_rows_restores_global_order():
    a, _ = _rectangular_pair()
    a = CSRMatrix.from_scipy(a)
    pieces = []
    for rows in (np.arange(0, 310, 3), np.arange(1, 310, 3), np.arange(2, 310, 3)):
        block = a.rows(rows)
        pieces.append({"rows": rows, "indptr": block.indptr.astype(np.int64),
                       "indices": block.indices, "data": block.data})
    c = assemble_rows(pieces, a.nrows, a.ncols, a.indices.dtype, a.data.dtype)
    np.testing.assert_array_equal(c.indptr, a.indptr)
    np.testing.assert_array_equal(c.indices, a.indices)
    np.testing.assert_array_equal(c.data, a.data)


def test_bins_cover_tables_and_fit_shared_memory():
    from hisparse.ops._spgemm_gpu import bin_layout, largest_table, next_pow2
    np.testing.assert_array_equal(next_pow2([0, 1, 2, 3, 1000, 1024, 1025]),
                                  [1, 1, 2, 4, 1024, 1024, 2048])
    limit = 227 * 1024  # H100 opt-in shared memory per block
    assert largest_table(12, limit) * 12 <= limit < largest_table(12, limit) * 24
    for table, group, block in bin_layout(largest_table(12, limit)):
        assert block % group == 0 and (group <= 32 or group == block)
        assert (block // group) * table * 12 <= limit


# -- CPU path ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy,nprocs", [("row_modulo", 1), ("row_modulo", 2),
                                             ("product_balanced", 4)])
def test_cpu_rectangular_a_times_b(tmp_path, strategy, nprocs):
    a, b = _rectangular_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b)
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/", backend="cpu",
                     partition=f"{{strategy: {strategy}}}")
    result_file, run = _run(tmp_path, config, nprocs)
    assert run["attrs"]["verify_passed"] and run["attrs"]["nranks"] == nprocs
    _assert_matches(_c_of(result_file, (310, 260)), a, b, 1e-12)
    products = row_products(CSRMatrix.from_scipy(a), CSRMatrix.from_scipy(b)).sum()
    assert run["attrs"]["flops"] == 2 * products
    assert int(np.sum(run["rank_vars"]["n_rows"])) == 310


@pytest.mark.parametrize("nprocs", [2, 4])
def test_cpu_power_law_a_squared_in_chunks(tmp_path, nprocs):
    a = _power_law()
    _write(tmp_path / "a.h5", a)
    config = _config(tmp_path, tmp_path / "a.h5", params={"chunk_rows": 97}, backend="cpu")
    result_file, run = _run(tmp_path, config, nprocs)
    assert run["attrs"]["chunked"] and run["attrs"]["n_chunks_max"] > 1
    _assert_matches(_c_of(result_file, a.shape), a, a, 1e-12)


def test_cpu_duplicate_heavy_keep_distributed(tmp_path):
    a, b = _duplicate_heavy_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b)
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/",
                     params={"keep_distributed": "true"}, backend="cpu")
    result_file, run = _run(tmp_path, config, 2)
    assert run["attrs"]["verify_passed"] and run["attrs"]["keep_distributed"]
    reference = (a @ b).tocsr()
    with h5py.File(result_file, "r") as handle:
        np.testing.assert_array_equal(handle["result/row_nnz"][()], np.diff(reference.indptr))
        np.testing.assert_allclose(handle["result/row_sums"][()],
                                   np.asarray(reference.sum(axis=1)).ravel(), rtol=1e-12,
                                   atol=1e-12)


def test_cpu_rejects_mismatched_b(tmp_path):
    a, b = _rectangular_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b.T.tocsr())
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/", backend="cpu")
    proc = run_hisparse(["run", config, "--quiet"], nprocs=1)
    assert proc.returncode != 0
    assert "B has 260 rows but A has 200 columns" in proc.stderr


# -- GPU path ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("precision,index_width", [("fp64", "int32"), ("fp64", "int64"),
                                                   ("fp32", "int32"), ("fp32", "int64")])
def test_gpu_rectangular_precisions(tmp_path, precision, index_width):
    a, b = _rectangular_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b)
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/", backend="gpu",
                     precision=precision, index_width=index_width)
    result_file, run = _run(tmp_path, config, 1)
    assert run["attrs"]["backend"] == "gpu" and run["attrs"]["peak_device_bytes"] > 0
    c = _c_of(result_file, (310, 260))
    if precision == "fp64":
        _assert_matches(c, a, b, 1e-12)
    else:
        a32 = a.astype(np.float32).astype(np.float64)
        b32 = b.astype(np.float32).astype(np.float64)
        _assert_matches(c, a32, b32, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs,strategy", [(1, "row_modulo"), (2, "row_modulo"),
                                             (4, "product_balanced")])
def test_gpu_power_law_a_squared(tmp_path, nprocs, strategy):
    a = _power_law()
    _write(tmp_path / "a.h5", a)
    config = _config(tmp_path, tmp_path / "a.h5", backend="gpu",
                     partition=f"{{strategy: {strategy}}}")
    result_file, run = _run(tmp_path, config, nprocs)
    _assert_matches(_c_of(result_file, a.shape), a, a, 1e-12)
    kernel_phases = [run["phases"].index(p) for p in ("binning", "symbolic", "numeric")]
    assert np.all(np.isfinite(run["gpu"][:, :, kernel_phases]))


@pytest.mark.gpu
@pytest.mark.parametrize("dense", ["true", "false"])
def test_gpu_rows_beyond_shared_tables(tmp_path, dense):
    """Two rows with more outputs than the largest shared table: dense bitmap/accumulator
    kernels, or (dense_long_rows false) global hash tables after a shared-table overflow."""
    a, b = _long_row_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b)
    reference = (a @ b).tocsr()
    assert np.diff(reference.indptr).max() > 40000  # beyond any shared table of the device
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/", backend="gpu",
                     params={"dense_long_rows": dense})
    result_file, run = _run(tmp_path, config, 1)
    assert run["attrs"]["numeric_global_rows"] == 2
    if dense == "true":
        assert run["attrs"]["symbolic_dense_rows"] >= 1
        assert run["attrs"]["numeric_dense_rows"] == 2
    else:
        assert run["attrs"]["symbolic_global_rows"] >= 1
        assert run["attrs"]["numeric_dense_rows"] == 0
    _assert_matches(_c_of(result_file, a.shape[:1] + b.shape[1:]), a, b, 1e-12)


@pytest.mark.gpu
def test_gpu_small_tables_and_memory_chunks(tmp_path):
    """Cap shared tables at 64 entries (most rows take the global kernels) and give C less
    memory than it needs, so the numeric phase runs in chunks."""
    a = _power_law()
    _write(tmp_path / "a.h5", a)
    reference = (a @ a).tocsr()
    # Each of the 2 ranks holds B and half of A; its half of C needs ~6 bytes per nnz(C).
    budget = int(reference.nnz * 12 * 0.4 + a.nnz * 12 * 2 + 16 * a.shape[0])
    config = _config(tmp_path, tmp_path / "a.h5", backend="gpu",
                     params={"max_shared_table": 64, "memory_budget": budget,
                             "global_table_bytes": 1 << 16, "dense_long_rows": "false"})
    result_file, run = _run(tmp_path, config, 2)
    assert run["attrs"]["chunked_for_memory"] and run["attrs"]["n_chunks_max"] > 1
    assert run["attrs"]["numeric_global_rows"] > 0
    _assert_matches(_c_of(result_file, a.shape), a, a, 1e-12)


@pytest.mark.gpu
def test_gpu_duplicate_heavy_keep_distributed(tmp_path):
    a, b = _duplicate_heavy_pair()
    _write(tmp_path / "a.h5", a)
    _write(tmp_path / "b.h5", b)
    config = _config(tmp_path, tmp_path / "a.h5", f"{tmp_path / 'b.h5'}:/", backend="gpu",
                     params={"keep_distributed": "true", "chunk_rows": 50})
    result_file, run = _run(tmp_path, config, 2)
    assert run["attrs"]["verify_passed"]
    reference = (a @ b).tocsr()
    with h5py.File(result_file, "r") as handle:
        np.testing.assert_array_equal(handle["result/row_nnz"][()], np.diff(reference.indptr))

"""SpGEMM (C = A B, A A): results against SciPy on one and several ranks, CPU and GPU.

In order: the plan (pure functions), the engines on one rank's local data (each backend's engine
against SciPy), then whole runs on one and several ranks. Every run stores C under /result; the
tests rebuild it and compare with a SciPy product written plainly here: identical structure (row
pointers and sorted columns) and values within 1e-12 * (|A| |B|)_ij for fp64 (the bound of any
summation order).
"""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.config import config_from_dict
from hisparse.context import RunContext
from hisparse.formats import CSRMatrix
from hisparse.io import write_matrix
from hisparse.ops.spgemm.gpu import (bin_layout, bin_limits, global_batches, largest_table,
                                     next_pow2)
from hisparse.ops.spgemm.op import (SpGEMM, SpgemmLocal, assemble_rows, row_products,
                                    unify_index_dtypes)
from hisparse.parallel import get_world, node_local
from hisparse.timing import PhaseTimer

from helpers import config_dict, run_config, write_config

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


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


def _write_inputs(tmp_path, a, b=None):
    """A (and B) as HDF5 inputs; returns the ``b`` parameter: ``same`` or ``FILE.h5:/``."""
    write_matrix(tmp_path / "a.h5", CSRMatrix.from_scipy(a))
    if b is None:
        return "same"
    write_matrix(tmp_path / "b.h5", CSRMatrix.from_scipy(b))
    return f"{tmp_path / 'b.h5'}:/"


def _config(tmp_path, b_spec="same", params=None, **sections):
    """A run of SpGEMM on ``tmp_path/a.h5`` (see :func:`_write_inputs`)."""
    return write_config(tmp_path, "spgemm", {"b": b_spec, **(params or {})},
                        input={"path": str(tmp_path / "a.h5")}, **sections)


def _c_of(arrays, shape):
    return sp.csr_matrix((arrays["data"], arrays["indices"], arrays["indptr"]), shape=shape)


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


# -- plan ------------------------------------------------------------------------------------
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
    np.testing.assert_array_equal(next_pow2([0, 1, 2, 3, 1000, 1024, 1025]),
                                  [1, 1, 2, 4, 1024, 1024, 2048])
    limit = 227 * 1024  # H100 opt-in shared memory per block
    assert largest_table(12, limit) * 12 <= limit < largest_table(12, limit) * 24
    layout = bin_layout(largest_table(12, limit))
    for table, group, block in layout:
        assert block % group == 0 and (group <= 32 or group == block)
        assert (block // group) * table * 12 <= limit
    limits = bin_limits(layout, 0.75)
    assert len(limits) == len(layout) + 1 and limits[-1] == np.iinfo(np.int64).max
    np.testing.assert_array_equal(limits[:-1], [int(0.75 * t) for t, _, _ in layout])


def test_global_batches_cover_rows_within_the_byte_budget():
    sizes = next_pow2(np.random.default_rng(3).integers(1, 5000, size=200))
    entry_bytes = 12
    for budget in (1 << 16, 1 << 20):
        batches = global_batches(sizes, entry_bytes, budget)
        limit = max(budget // entry_bytes, sizes.max())  # the largest table always fits
        assert batches[0][0] == 0 and batches[-1][1] == len(sizes)
        assert all(stop == start for (_, stop), (start, _) in zip(batches, batches[1:]))
        for start, stop in batches:
            assert stop > start and sizes[start:stop].sum() <= limit
            # greedy: the next row would not have fitted
            assert stop == len(sizes) or sizes[start:stop + 1].sum() > limit
    assert len(global_batches(sizes, entry_bytes, 1 << 20)) < \
        len(global_batches(sizes, entry_bytes, 1 << 16))


# -- engines on one rank's local data ----------------------------------------------------------
def _engine_context(tmp_path, backend, params):
    """This process as a one-rank run of SpGEMM with ``params`` on ``backend``."""
    comm = get_world()
    config = config_from_dict(config_dict(tmp_path, "spgemm", params,
                                          input={"path": str(tmp_path / "a.h5")},
                                          backend=backend))
    device = None
    if backend == "gpu":
        from hisparse.gpu import bind_device
        device = bind_device(0)
    return RunContext(config=config, comm=comm, local_comm=node_local(comm), backend=backend,
                      timer=PhaseTimer(SpGEMM.phases()), device=device)


def _local_rows(a, b, rows, index_width):
    """What the plan hands the rank owning ``rows`` of A (None: all of A, and B is A)."""
    a = CSRMatrix.from_scipy(a)
    if b is None:
        a, _ = unify_index_dtypes(a, a, index_width)
        return SpgemmLocal(a, a, True, row_products(a, a))
    a, b = unify_index_dtypes(a, CSRMatrix.from_scipy(b), index_width)
    return SpgemmLocal(a.rows(rows), b, False, row_products(a, b)[rows])


ENGINE_CASES = {
    # rows of rank 1 of 3 under row-modulo, B given
    "rectangular-rank1of3": (_rectangular_pair, np.arange(1, 310, 3), {}),
    # one rank, B = A (held once), in row chunks
    "power-law-a-squared": (lambda: (_power_law(), None), None, {"chunk_rows": 97}),
    # small shared tables and no dense path: global hash tables for the long rows
    "long-rows-global": (_long_row_pair, np.arange(24),
                         {"max_shared_table": 64, "dense_long_rows": False,
                          "global_table_bytes": 1 << 16}),
    # long rows over the dense bitmap / accumulator kernels
    "long-rows-dense": (_long_row_pair, np.arange(24), {}),
    # C left in place: only the per-row digest comes back
    "duplicate-heavy-kept": (_duplicate_heavy_pair, np.arange(0, 180, 2),
                             {"keep_distributed": True}),
}


@pytest.mark.parametrize("index_width", ["int32", "int64"])
@pytest.mark.parametrize("case", list(ENGINE_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_engines_agree_with_scipy_on_local_rows(tmp_path, backend, case, index_width):
    make, rows, params = ENGINE_CASES[case]
    a, b = make()
    local = _local_rows(a, b, rows, index_width)
    ctx = _engine_context(tmp_path, backend, {"b": "same", **params})
    engine = SpGEMM(ctx).pick_engine(local)
    assert engine.BACKEND == backend
    a_rows = a if b is None else a[rows]
    b = a if b is None else b
    try:
        engine.upload()
        c_host = engine.multiply()
        if params.get("keep_distributed"):
            row_nnz, sums = engine.digest()
            reference = (a_rows @ b).tocsr()
            np.testing.assert_array_equal(row_nnz, np.diff(reference.indptr))
            np.testing.assert_allclose(sums, np.asarray(reference.sum(axis=1)).ravel(),
                                       rtol=1e-12, atol=1e-12)
        else:
            indptr, indices, data = c_host
            assert indices.dtype == local.a.indices.dtype
            c = sp.csr_matrix((data, indices, indptr), shape=(a_rows.shape[0], b.shape[1]))
            _assert_matches(c, a_rows, b, 1e-12)
        stats = engine.stats
        assert stats["nnz_c"] == (a_rows @ b).nnz
        if backend == "gpu":
            assert stats["peak_device_bytes"] >= stats["peak_device_bytes_in_use"] > 0
            assert engine.memory_stats()["peak_device_bytes"] > 0
            outputs = np.diff((a_rows @ b).tocsr().indptr)
            if case == "long-rows-global":
                # 64-entry tables: symbolic rows overflow past 7/8 of them (56 columns), numeric
                # rows above 0.75 x 64 = 48 outputs take global tables.
                assert stats["symbolic_global_rows"] == int(np.sum(outputs > 56))
                assert stats["numeric_global_rows"] == int(np.sum(outputs > 48))
                assert stats["numeric_dense_rows"] == 0
            if case == "long-rows-dense":
                assert stats["numeric_global_rows"] == stats["numeric_dense_rows"] == 2
    finally:
        if ctx.device is not None:
            ctx.timer.resolve()  # the phases' CUDA events, while their context is current
        engine.free()
        if ctx.device is not None:
            ctx.device.release()


# -- CPU runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy,nprocs", [("row_modulo", 1), ("row_modulo", 2),
                                             ("product_balanced", 4)])
def test_cpu_rectangular_a_times_b(tmp_path, strategy, nprocs):
    a, b = _rectangular_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b), backend="cpu",
                     partition={"strategy": strategy})
    run, arrays = run_config(tmp_path, config, nprocs)
    assert run["attrs"]["verify_passed"] and run["attrs"]["nranks"] == nprocs
    _assert_matches(_c_of(arrays, (310, 260)), a, b, 1e-12)
    products = row_products(CSRMatrix.from_scipy(a), CSRMatrix.from_scipy(b)).sum()
    assert run["attrs"]["flops"] == 2 * products
    assert int(np.sum(run["rank_vars"]["n_rows"])) == 310


@pytest.mark.parametrize("nprocs", [2, 4])
def test_cpu_power_law_a_squared_in_chunks(tmp_path, nprocs):
    a = _power_law()
    config = _config(tmp_path, _write_inputs(tmp_path, a), {"chunk_rows": 97}, backend="cpu")
    run, arrays = run_config(tmp_path, config, nprocs)
    assert run["attrs"]["chunked"] and run["attrs"]["n_chunks_max"] > 1
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)


def test_cpu_duplicate_heavy_keep_distributed(tmp_path):
    a, b = _duplicate_heavy_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b), {"keep_distributed": True},
                     backend="cpu")
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["verify_passed"] and run["attrs"]["keep_distributed"]
    reference = (a @ b).tocsr()
    np.testing.assert_array_equal(arrays["row_nnz"], np.diff(reference.indptr))
    np.testing.assert_allclose(arrays["row_sums"], np.asarray(reference.sum(axis=1)).ravel(),
                               rtol=1e-12, atol=1e-12)


def test_cpu_rejects_mismatched_b(tmp_path):
    a, b = _rectangular_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b.T.tocsr()), backend="cpu")
    proc = run_config(tmp_path, config, 1, expect_rc=2)
    assert proc.returncode != 0
    assert "B has 260 rows but A has 200 columns" in proc.stderr


# -- GPU runs ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("precision,index_width", [("fp64", "int32"), ("fp64", "int64"),
                                                   ("fp32", "int32"), ("fp32", "int64")])
def test_gpu_rectangular_precisions(tmp_path, precision, index_width):
    a, b = _rectangular_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b), backend="gpu",
                     precision=precision, index_width=index_width)
    run, arrays = run_config(tmp_path, config, 1)
    assert run["attrs"]["backend"] == "gpu" and run["attrs"]["peak_device_bytes"] > 0
    c = _c_of(arrays, (310, 260))
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
    config = _config(tmp_path, _write_inputs(tmp_path, a), backend="gpu",
                     partition={"strategy": strategy})
    run, arrays = run_config(tmp_path, config, nprocs)
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)
    kernel_phases = [run["phases"].index(p) for p in ("binning", "symbolic", "numeric")]
    assert np.all(np.isfinite(run["gpu"][:, :, kernel_phases]))


@pytest.mark.gpu
@pytest.mark.parametrize("dense", [True, False])
def test_gpu_rows_beyond_shared_tables(tmp_path, dense):
    """Two rows with more outputs than the largest shared table: dense bitmap/accumulator
    kernels, or (dense_long_rows false) global hash tables after a shared-table overflow."""
    a, b = _long_row_pair()
    reference = (a @ b).tocsr()
    assert np.diff(reference.indptr).max() > 40000  # beyond any shared table of the device
    config = _config(tmp_path, _write_inputs(tmp_path, a, b), {"dense_long_rows": dense},
                     backend="gpu")
    run, arrays = run_config(tmp_path, config, 1)
    assert run["attrs"]["numeric_global_rows"] == 2
    if dense:
        assert run["attrs"]["symbolic_dense_rows"] >= 1
        assert run["attrs"]["numeric_dense_rows"] == 2
    else:
        assert run["attrs"]["symbolic_global_rows"] >= 1
        assert run["attrs"]["numeric_dense_rows"] == 0
    _assert_matches(_c_of(arrays, a.shape[:1] + b.shape[1:]), a, b, 1e-12)


@pytest.mark.gpu
def test_gpu_small_tables_and_memory_chunks(tmp_path):
    """Cap shared tables at 64 entries (most rows take the global kernels) and give C less
    memory than it needs, so the numeric phase runs in chunks."""
    a = _power_law()
    reference = (a @ a).tocsr()
    # Each of the 2 ranks holds B and half of A; its half of C needs ~6 bytes per nnz(C).
    budget = int(reference.nnz * 12 * 0.4 + a.nnz * 12 * 2 + 16 * a.shape[0])
    config = _config(tmp_path, _write_inputs(tmp_path, a),
                     {"max_shared_table": 64, "memory_budget": budget,
                      "global_table_bytes": 1 << 16, "dense_long_rows": False}, backend="gpu")
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["chunked_for_memory"] and run["attrs"]["n_chunks_max"] > 1
    assert run["attrs"]["numeric_global_rows"] > 0
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)


@pytest.mark.gpu
def test_gpu_duplicate_heavy_keep_distributed(tmp_path):
    a, b = _duplicate_heavy_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b),
                     {"keep_distributed": True, "chunk_rows": 50}, backend="gpu")
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["verify_passed"]
    reference = (a @ b).tocsr()
    np.testing.assert_array_equal(arrays["row_nnz"], np.diff(reference.indptr))

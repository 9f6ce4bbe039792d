"""SpGEMM (C = A B, A A): results against SciPy on one and several ranks, CPU and GPU.

In order: the plan (pure functions), the checksums that verify a C left distributed, the engines
on one rank's local data (each backend's engine against SciPy), the operation in this process
(collect, and verification catching a corrupted C, at 1, 2 and 4 ranks), then whole runs on one
and several ranks. Runs store C (or its checksums) under /result; the tests rebuild it and compare
with a SciPy product written plainly here: identical structure (row pointers and sorted columns)
and values within 1e-12 * (|A| |B|)_ij for fp64 (the bound of any summation order).
"""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.formats import CSRMatrix, rows_sorted
from hisparse.io import write_matrix
from hisparse.ops.spgemm.checksums import (checksum_errors, column_weights, sample_positions,
                                           structural_row_counts, take_rows)
from hisparse.errors import ConfigError
from hisparse.ops.spgemm.plan import (SKEW_RATIO, STATIC_SHARED, WINDOW_SEGMENT_BYTES,
                                      bin_layout, bin_limits, global_batches, largest_table,
                                      next_pow2, numeric_bin_index, pack_groups, plan_bounded,
                                      plan_kernels, product_weighted_row_length, rank_bytes,
                                      rank_words, skewed_rows, symbolic_bin_counts, uses_rank,
                                      window_columns)
from hisparse.ops.spgemm.op import (SpGEMM, SpgemmLocal, assemble_rows, row_products,
                                    unify_index_dtypes)
from hisparse.parallel import get_world, node_local

from conftest import ROOT
from helpers import bind_gpu, run_config, run_context, write_config

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


def _window_row_pair(seed=9):
    """A row of 13,000 products over B's 30,000 columns (about 10k outputs): beyond the largest
    shared table by its bound, so the bounded-output pass gives it the dense windows (B is
    wider than one), and short enough for one block to pack it."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 12, size=16)
    lengths[5] = 130
    a = sp.lil_matrix((16, 400))
    for row, k in enumerate(lengths):
        a[row, rng.choice(400, size=k, replace=False)] = rng.standard_normal(k)
    b_rows = np.repeat(np.arange(400), 100)
    b_cols = np.concatenate([rng.choice(30000, size=100, replace=False) for _ in range(400)])
    b = sp.csr_matrix((rng.standard_normal(len(b_rows)), (b_rows, b_cols)), shape=(400, 30000))
    return a.tocsr(), b


def _long_row_pair_unsorted_b():
    """_long_row_pair with B's columns in reverse order within every row (the window kernel
    then cannot find a window's products by binary search)."""
    a, b = _long_row_pair()
    b = b.tocsr()
    b.sort_indices()
    indices, data = b.indices.copy(), b.data.copy()
    for row in range(b.shape[0]):
        span = slice(b.indptr[row], b.indptr[row + 1])
        indices[span], data[span] = indices[span][::-1], data[span][::-1]
    return a, CSRMatrix(b.indptr, indices, data, b.shape)


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
@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_row_products_counts_every_intermediate_product(chunk, monkeypatch):
    """Per row of A, the entries of the B rows its entries name, counted row by row in Python;
    with as many blocks of rows (threads' items: 4 per core) as ``chunk`` cores make, blocks
    that end on empty rows, and an A without entries."""
    from hisparse import threads
    monkeypatch.setattr(threads, "usable_cores", lambda: chunk)
    a, b = _rectangular_pair()
    a = a.tolil()
    a[:3, :] = 0  # leading, inner and trailing empty rows
    a[100:113, :] = 0
    a[-2:, :] = 0
    a = a.tocsr()
    a.eliminate_zeros()
    for left in (a, sp.csr_matrix(a.shape)):
        expected = [sum(b[k].nnz for k in left[i].indices) for i in range(left.shape[0])]
        got = row_products(CSRMatrix.from_scipy(left), CSRMatrix.from_scipy(b))
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("case", ["random", "cancelling", "empty_rows_and_columns", "empty",
                                  "rectangular"])
def test_reference_product_is_scipys_array_for_array(case):
    """The verification's compiled C = A B: SciPy's sorted product with its exact zeros of
    cancellation dropped, the same indptr, indices and values bit for bit."""
    from hisparse.ops.spgemm.reference import csr_matmat
    rng = np.random.default_rng(len(case))
    shapes = {"rectangular": (70, 130, 45)}
    m, k, n = shapes.get(case, (150, 150, 150))
    a = sp.random(m, k, density=0.06, random_state=rng, format="csr")
    b = sp.random(k, n, density=0.06, random_state=rng, format="csr")
    if case == "cancelling":  # +-1 values: many sums are exactly 0
        a.data = rng.choice([-1.0, 1.0], a.nnz)
        b.data = rng.choice([-1.0, 1.0], b.nnz)
    if case == "empty_rows_and_columns":
        a = sp.csr_matrix(sp.diags((np.arange(m) % 5 != 0).astype(float)) @ a)
        a.eliminate_zeros()
        b = sp.csr_matrix(b @ sp.diags((np.arange(n) % 3 != 0).astype(float)))
        b.eliminate_zeros()
    if case == "empty":
        a = sp.csr_matrix((m, k))
    want = (a @ b).tocsr()
    want.sort_indices()
    got = csr_matmat(a, b)
    assert got.shape == want.shape
    for field in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(got, field), getattr(want, field), err_msg=field)
    if case == "cancelling":  # the case does cancel: fewer entries than the structure's
        assert want.nnz < (abs(a) @ abs(b)).nnz


def test_reference_product_falls_back_to_scipy_for_very_wide_b(monkeypatch):
    """Past the accumulators' memory budget SciPy's product serves, with the same arrays."""
    from hisparse.ops.spgemm import reference
    a = sp.random(60, 80, density=0.1, random_state=3, format="csr")
    b = sp.random(80, 90, density=0.1, random_state=4, format="csr")
    compiled = reference.csr_matmat(a, b)
    monkeypatch.setattr(reference, "ACCUMULATOR_BYTES", 0)
    fallback = reference.csr_matmat(a, b)
    for field in ("indptr", "indices", "data"):
        np.testing.assert_array_equal(getattr(fallback, field), getattr(compiled, field))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_compare_finds_every_kind_of_wrong_c(dtype):
    """SpGEMM.compare on a gathered C: 0 for the reference itself (float32 values compared in
    float64), the value error for a wrong value, NaN for a NaN, inf for a row out of order or a
    missing entry, 0 for an extra entry holding an exact zero (SciPy drops those)."""
    from hisparse.ops.spgemm.reference import csr_matmat
    a = sp.random(120, 120, density=0.05, random_state=5, format="csr")
    reference = csr_matmat(a, a)
    scale = float(np.abs(reference.data).max())
    op = object.__new__(SpGEMM)

    def c(indptr=None, indices=None, data=None):
        return CSRMatrix(np.asarray(reference.indptr if indptr is None else indptr, np.int64),
                         (reference.indices if indices is None else indices).copy(),
                         (reference.data if data is None else data).astype(dtype),
                         reference.shape)

    exact = op.compare(c(), reference)
    assert exact <= (0 if dtype == np.float64 else 1e-6)
    wrong = reference.data.copy()
    wrong[77] += 0.5
    assert op.compare(c(data=wrong), reference) == pytest.approx(0.5 / scale, rel=1e-5)
    wrong[77] = np.nan
    assert np.isnan(op.compare(c(data=wrong), reference))
    row = int(np.flatnonzero(np.diff(reference.indptr) >= 2)[0])
    swapped = reference.indices.copy()
    first = reference.indptr[row]
    swapped[first], swapped[first + 1] = swapped[first + 1], swapped[first]
    assert op.compare(c(indices=swapped), reference) == float("inf")
    dense = reference.toarray()
    dense[row, reference.indices[first]] = 0  # drop one entry of the reference's structure
    missing = sp.csr_matrix(dense)
    assert op.compare(c(missing.indptr, missing.indices, missing.data), reference) == \
        float("inf")
    empty_spot = int(np.flatnonzero(dense[row] == 0)[-1])
    extra = sp.lil_matrix(reference.toarray())
    extra[row, empty_spot] = 1.0  # an entry SciPy would not store, holding 0 below
    extra = extra.tocsr()
    values = extra.data.copy()
    values[extra.indptr[row] + np.flatnonzero(extra.indices[extra.indptr[row]:
                                                            extra.indptr[row + 1]] ==
                                              empty_spot)[0]] = 0.0
    assert op.compare(c(extra.indptr, extra.indices, values), reference) <= \
        (0 if dtype == np.float64 else 1e-6)


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


def test_pack_groups_fill_each_block_without_passing_its_capacity():
    """Consecutive rows, every row in one group, each group's bounds within the capacity and
    the next row would pass it (greedy); empty rows ride along."""
    rng = np.random.default_rng(13)
    for capacity in (5, 17, 2048):
        bounds = rng.integers(0, capacity + 1, size=1000)
        bounds[100:140] = 0
        firsts = pack_groups(bounds, capacity)
        assert firsts[0] == 0 and firsts[-1] == len(bounds) and np.all(np.diff(firsts) > 0)
        ends = np.concatenate([[0], np.cumsum(bounds)])
        sums = ends[firsts[1:]] - ends[firsts[:-1]]
        assert sums.max() <= capacity
        assert np.all(sums[:-1] + bounds[firsts[1:-1]] > capacity)
    np.testing.assert_array_equal(pack_groups(np.zeros(3, np.int64), 8), [0, 3])


def test_symbolic_bin_counts_follow_the_device_rule():
    """The host's launch sizes are the bins row_products gives each row on the device: the first
    bin whose limit holds min(products, ncols(B)); rows without products in none."""
    rng = np.random.default_rng(11)
    products = np.concatenate([[0, 0, 1, 26, 27], rng.integers(0, 60000, size=500)])
    limits = bin_limits(bin_layout(largest_table(4, 227 * 1024)), 0.8)
    for n_cols in (40, 5000, 10 ** 6):
        expected = np.zeros(len(limits), np.int64)
        for count in products:  # one row at a time, as a thread of row_products does
            bound = min(int(count), n_cols)
            if bound > 0:
                expected[next(b for b, limit in enumerate(limits) if bound <= limit)] += 1
        np.testing.assert_array_equal(symbolic_bin_counts(products, n_cols, limits), expected)


def test_numeric_bin_index_follows_the_device_rule():
    """numeric_bins on the device, one row at a time as this test writes it: the first table
    whose limit holds the size; then, in the tables' range, the dense bin when ncols(B) <=
    short_ratio x size; beyond the tables the window bin when ncols(B) <= window_ratio x size,
    else the global bin; size 0 in none."""
    rng = np.random.default_rng(12)
    sizes = np.concatenate([[0, 1, 24, 25, 12288, 12289], rng.integers(0, 40000, size=400)])
    limits = bin_limits(bin_layout(largest_table(12, 227 * 1024)), 0.75)
    tables = len(limits) - 1
    for n_cols, short_ratio, window_ratio in ((8298, 16, 64), (8298, 0, 0), (10 ** 6, 0, 64),
                                              (40, 16, 64)):
        expected = []
        for size in sizes.tolist():
            if size == 0:
                expected.append(-1)
                continue
            table = next((b for b in range(tables) if size <= limits[b]), None)
            if table is not None:
                dense = short_ratio > 0 and n_cols <= short_ratio * size
                expected.append(tables if dense else table)
            else:
                window = window_ratio > 0 and n_cols <= window_ratio * size
                expected.append(tables + 1 if window else tables + 2)
        np.testing.assert_array_equal(
            numeric_bin_index(sizes, limits, n_cols, short_ratio, window_ratio), expected)


def test_rank_bitmaps_and_dense_windows_fit_shared_memory():
    limit = 227 * 1024
    for n_cols in (1, 31, 4039, 36692, 262144, 10 ** 6):
        words = rank_words(n_cols)
        assert words % 16 == 0 and 32 * words >= n_cols > 32 * (words - 16)
        assert rank_bytes(n_cols) == 4 * words + 4 * (words // 16)
        for value_bytes in (4, 8):
            window = window_columns(value_bytes, n_cols, limit)
            assert window % 32 == 0 and window >= min(n_cols, 1024)
            usable = limit - STATIC_SHARED - WINDOW_SEGMENT_BYTES
            assert window * value_bytes + window // 8 <= usable
            # B wider than one window: the largest window of whole KB-columns
            if n_cols > window:
                assert (window + 1024) * value_bytes + (window + 1024) // 8 > usable
        for table, group, block in bin_layout(largest_table(12, limit)):
            if uses_rank(table, group, block, 12, n_cols, limit):
                assert group >= 32 and rank_bytes(n_cols) <= 2 * table * 12
                assert (block // group) * (table * 12 + rank_bytes(n_cols)) <= \
                    limit - STATIC_SHARED
    # R-MAT scale 18 on an H100: the 4096..16384 tables write by rank, 1024 sorts
    ranked = [table for table, group, block in bin_layout(largest_table(12, limit))
              if uses_rank(table, group, block, 12, 1 << 18, limit)]
    assert ranked == [2048, 4096, 8192, 16384]


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


# -- checksums of a distributed C -------------------------------------------------------------
def _fmix32(value):
    """MurmurHash3's 32-bit finaliser, written with Python integers."""
    h = value & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def test_column_weights_are_the_hash_of_the_column():
    columns = np.array([0, 1, 2, 77, 2**31 - 1, 2**32 + 5, 123456789], dtype=np.int64)
    expected = [1 + (_fmix32(int(j)) >> 8) / 2**24 for j in columns]
    np.testing.assert_array_equal(column_weights(columns), expected)
    weights = column_weights(np.arange(100000))
    assert weights.min() >= 1.0 and weights.max() < 2.0
    assert len(np.unique(weights)) > 99000  # a moved entry changes its row's weighted sum


def test_sampled_positions_and_rows():
    row_nnz = np.array([3, 0, 9, 1, 4, 4, 0, 2])
    positions = sample_positions(row_nnz, 4)
    assert positions.tolist() == [0, 2, 4, 7]  # 0, 3.5 -> 4, 7 evenly; 2 the longest
    assert sample_positions(row_nnz, 1).tolist() == [2]
    assert sample_positions(row_nnz, 0).size == sample_positions(row_nnz[:0], 5).size == 0
    a, _ = _rectangular_pair()
    indptr, indices, data = take_rows(a.indptr, a.indices, a.data, np.array([0, 5, 77]))
    expected = a[[0, 5, 77]]
    np.testing.assert_array_equal(indptr, expected.indptr)
    np.testing.assert_array_equal(indices, expected.indices)
    np.testing.assert_array_equal(data, expected.data)


def test_structural_counts_keep_cancelled_entries(monkeypatch):
    a = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]]))
    b = sp.csr_matrix(np.array([[1.0, 2.0], [-1.0, 5.0], [0.0, 3.0]]))
    assert (a @ b).tocsr()[0].nnz == 1  # SciPy drops the entry (0, 0) = 1 - 1
    products = row_products(CSRMatrix.from_scipy(a), CSRMatrix.from_scipy(b))
    expected = [2, 1, 0]
    np.testing.assert_array_equal(structural_row_counts(a, b, products), expected)
    rmat = _power_law()
    products = row_products(CSRMatrix.from_scipy(rmat), CSRMatrix.from_scipy(rmat))
    reference = np.diff((abs(rmat) @ abs(rmat)).tocsr().indptr)
    monkeypatch.setattr("hisparse.ops.spgemm.checksums.PATTERN_CHUNK_PRODUCTS", 5000)
    np.testing.assert_array_equal(structural_row_counts(rmat, rmat, products), reference)


# -- engines on one rank's local data ----------------------------------------------------------
def _engine_context(tmp_path, backend, params, verify=True):
    """This process as a run of SpGEMM with ``params`` on ``backend`` (one rank, or every rank
    of the world under mpiexec)."""
    comm = get_world()
    return run_context(tmp_path, "spgemm", params, backend,
                       bind_gpu(backend, node_local(comm).rank), comm,
                       input={"path": str(tmp_path / "a.h5")}, verify={"enabled": verify})


def _local_rows(a, b, rows, index_width):
    """What the plan hands the rank owning ``rows`` of A (None: all of A, and B is A)."""
    a = CSRMatrix.from_scipy(a)
    if b is None:
        a, _ = unify_index_dtypes(a, a, index_width)
        return SpgemmLocal(a, a, True, row_products(a, a))
    b = b if isinstance(b, CSRMatrix) else CSRMatrix.from_scipy(b)  # a CSRMatrix as it is
    a, b = unify_index_dtypes(a, b, index_width)
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
    # long rows over the dense bitmap / accumulator kernels (B wider than one window: each
    # window's products found by binary search in B's sorted rows)
    "long-rows-dense": (_long_row_pair, np.arange(24), {"balanced_products": True}),
    # the same with B's rows unsorted: every window reads all of the row's products
    "long-rows-dense-unsorted-b": (_long_row_pair_unsorted_b, np.arange(24),
                                   {"balanced_products": True}),
    # the same with one B row per warp (no dealing of products to the warps)
    "long-rows-dense-unbalanced": (_long_row_pair, np.arange(24), {"balanced_products": False}),
    # every output entry gathers about 15 products
    "duplicate-heavy": (_duplicate_heavy_pair, np.arange(0, 180, 2), {}),
    # a row for the dense windows by its bound (the bounded-output pass: windows report counts)
    "window-row": (_window_row_pair, np.arange(16), {}),
}


#: cases the bounded-output pass cannot take: global tables, row chunks, or rows longer than one
#: block of the packing kernel holds (the long rows' ~60k-entry bounds)
NEEDS_SYMBOLIC = ("long-rows-global", "power-law-a-squared", "long-rows-dense",
                  "long-rows-dense-unsorted-b", "long-rows-dense-unbalanced")


@pytest.mark.parametrize("bounded", [None, False])
@pytest.mark.parametrize("index_width", ["int32", "int64"])
@pytest.mark.parametrize("case", list(ENGINE_CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_engines_agree_with_scipy_on_local_rows(tmp_path, backend, case, index_width, bounded):
    """``bounded``: the GPU engine's choice (null: the bounded-output pass on these small
    products wherever no row needs exact counts) or the symbolic pass (false)."""
    if backend == "cpu" and bounded is False:
        pytest.skip("the CPU engine has no symbolic pass to skip")
    make, rows, params = ENGINE_CASES[case]
    a, b = make()
    local = _local_rows(a, b, rows, index_width)
    ctx = _engine_context(tmp_path, backend, {"b": "same", "bounded_output": bounded, **params})
    op = SpGEMM(ctx)
    engine = op.pick_engine(local)
    assert engine.BACKEND == backend
    a_rows = a if b is None else a[rows]
    b = a if b is None else b
    b = b.to_scipy() if isinstance(b, CSRMatrix) else b
    try:
        op.upload(engine)
        if backend == "gpu" and case.startswith("long-rows-dense"):
            assert engine.window_search == (case != "long-rows-dense-unsorted-b")
            assert engine.balanced == (case != "long-rows-dense-unbalanced")
        if backend == "gpu":
            assert engine.bounded == (bounded is None and case not in NEEDS_SYMBOLIC)
            # the bounded repeat was recorded as a CUDA graph at upload (gpu.graphs is on)
            assert (engine.graphs is not None and "bounded" in engine.graphs.graphs) == \
                engine.bounded
        engine.multiply()
        reserved = engine.arena.reserved if backend == "gpu" else 0
        engine.multiply()  # the second repeat hands the first one's C back before its own
        if backend == "gpu":  # ... and reuses its blocks: no new device memory
            assert engine.arena.reserved == reserved
        # checksums and sampled rows where C is (device kernel on the GPU) before the download
        row_nnz, sums, weighted = engine.checksums()
        positions = sample_positions(row_nnz, 5)
        sample = engine.sample(positions)
        indptr, indices, data = engine.local_result()
        assert indices.dtype == local.a.indices.dtype
        c = sp.csr_matrix((data, indices, indptr), shape=(a_rows.shape[0], b.shape[1]))
        _assert_matches(c, a_rows, b, 1e-12)
        reference = (a_rows @ b).tocsr()
        reference.sort_indices()
        np.testing.assert_array_equal(row_nnz, np.diff(reference.indptr))
        scale = (abs(a_rows) @ (abs(b) @ np.full(b.shape[1], 2.0))).max()
        np.testing.assert_allclose(sums, reference @ np.ones(b.shape[1]), rtol=0,
                                   atol=1e-12 * scale)
        np.testing.assert_allclose(weighted, reference @ column_weights(np.arange(b.shape[1])),
                                   rtol=0, atol=1e-12 * scale)
        rows_ref = reference[positions]
        np.testing.assert_array_equal(sample[0], rows_ref.indptr)
        np.testing.assert_array_equal(sample[1], rows_ref.indices)
        np.testing.assert_array_equal(sample[2], c[positions].data)
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
            if case == "window-row" and engine.bounded:  # row 5, binned by its bound
                assert stats["numeric_global_rows"] == stats["numeric_dense_rows"] == 1
    finally:
        if ctx.device is not None:
            ctx.timer.resolve()  # the phases' CUDA events, while their context is current
        engine.free()
        if ctx.device is not None:
            ctx.device.release()


# -- the operation in this process: collect and verification ---------------------------------
def _edit_local_c(engine, edit):
    """Apply ``edit(indptr, indices, data)`` in place to the rank's C, wherever it is."""
    device = getattr(engine, "c_device", None)
    if device is None:
        edit(*engine.c_host)
        return
    arrays = [array.get() for array in device]
    edit(*arrays)
    for array, host in zip(device, arrays):
        array.set(host)


def _corruption(kind, sample_rows):
    """An edit of one entry of the rank's C in a row with at least two entries: ``value`` (a
    wrong value), ``column`` (the value in a column the row lacks, sums unchanged), both outside
    the sampled rows, or ``sampled`` (a wrong value in a sampled row)."""
    def edit(indptr, indices, data):
        row_nnz = np.diff(indptr)
        sampled = sample_positions(row_nnz, sample_rows)
        candidates = sampled if kind == "sampled" else np.setdiff1d(np.arange(len(row_nnz)),
                                                                    sampled)
        row = int(candidates[np.flatnonzero(row_nnz[candidates] >= 2)[0]])
        entry = int(indptr[row]) + 1
        if kind == "column":
            present = set(indices[indptr[row]:indptr[row + 1]].tolist())
            new = next(j for j in range(10**6) if j not in present)
            assert column_weights([new])[0] != column_weights([indices[entry]])[0]
            indices[entry] = new
        else:
            data[entry] += 1.0
    return edit


def _run_operation(tmp_path, a, backend, params, corrupt=None, verify=True):
    """Set up, run two repeats, optionally corrupt every rank's C (``corrupt(engine)``), collect;
    returns ``(op, {name: error})`` with the errors of verification on rank 0 (``None``
    elsewhere): ``checksum_errors`` when C stayed distributed, else ``{"c": compare}``."""
    ctx = _engine_context(tmp_path, backend, {"b": "same", **params}, verify=verify)
    op = SpGEMM(ctx)
    try:
        op.setup(CSRMatrix.from_scipy(a) if ctx.is_root else None)
        op.run_once()
        op.run_once()
        if corrupt is not None:
            corrupt(op.engine)
        op.collect()
        errors = None
        if ctx.is_root:
            result, reference = op.result(), op.reference(None)
            errors = checksum_errors(result, reference) if isinstance(result, dict) else {}
            errors["c"] = op.compare(result, reference)
        return op, errors
    finally:
        if ctx.device is not None:
            ctx.timer.resolve()
        op.teardown()
        if ctx.device is not None:
            ctx.device.release()


def _agree(ok):
    from mpi4py import MPI
    return get_world().allreduce(bool(ok), op=MPI.LAND)


def _check_corruption_caught(tmp_path, backend):
    """On every rank count: C gathered whole or as checksums verifies; a corrupted value or
    column on the last rank fails verification through the checksum that sees it."""
    comm = get_world()
    a = _power_law(n=600)
    rtol = SpGEMM.DEFAULT_RTOL["fp64"]
    checks = []
    op, errors = _run_operation(tmp_path, a, backend, {})
    if comm.rank == 0:
        checks += [op.collected == "full", errors["c"] <= rtol]
        c = op.result()
        _assert_matches(sp.csr_matrix((c.data, c.indices, c.indptr), shape=c.shape), a, a, 1e-12)
    op, errors = _run_operation(tmp_path, a, backend, {"keep_distributed": True})
    if comm.rank == 0:
        checks += [op.collected == "checksums", max(errors.values()) <= rtol,
                   len(op.result()["sample_rows"]) > comm.size]
    for kind, caught_by in (("value", "row_sums"), ("column", "row_weighted_sums"),
                            ("sampled", "sampled_rows")):
        def corrupt(engine, kind=kind):
            if comm.rank == comm.size - 1:
                _edit_local_c(engine, _corruption(kind, 8))
        op, errors = _run_operation(tmp_path, a, backend, {"keep_distributed": True}, corrupt)
        if comm.rank == 0:
            checks += [errors[caught_by] > 1e3 * rtol, errors["c"] > rtol, errors["row_nnz"] == 0]
            if kind == "column":
                checks.append(errors["row_sums"] <= rtol)
    assert _agree(all(checks)), checks


def test_corrupted_distributed_c_fails_verification(tmp_path):
    _check_corruption_caught(tmp_path, "cpu")


@pytest.mark.parallel(nprocs=[2, 4])
def test_corrupted_distributed_c_fails_verification_on_ranks(tmp_path, nprocs):
    _check_corruption_caught(tmp_path, "cpu")


def test_collect_gathers_c_only_when_needed(tmp_path):
    a = _power_law(n=300)
    nnz = (a @ a).nnz
    for params, verify, mode in (({}, True, "full"),
                                 ({"store_result_max_nnz": nnz}, False, "full"),
                                 ({"store_result_max_nnz": nnz - 1}, False, "checksums"),
                                 ({"keep_distributed": True}, True, "checksums")):
        op, errors = _run_operation(tmp_path, a, "cpu", params, verify=verify)
        assert op.collected == mode and op.summary()["collected"] == mode
        assert op.summary()["nnz_c"] == nnz
        assert errors["c"] <= 1e-12


@pytest.mark.gpu
def test_gpu_corrupted_distributed_c_fails_verification(tmp_path):
    _check_corruption_caught(tmp_path, "gpu")


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[2])
def test_gpu_corrupted_distributed_c_fails_verification_on_ranks(tmp_path, nprocs):
    _check_corruption_caught(tmp_path, "gpu")


# -- CPU runs ----------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy,nprocs", [("row_modulo", 1), ("row_modulo", 2),
                                             ("row_blocks", 3), ("auto", 2),
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


def _assert_checksums_match(arrays, a, b):
    """/result of a C left distributed: row counts, sums, weighted sums and sampled rows."""
    reference = (a @ b).tocsr()
    reference.sort_indices()
    scale = (abs(a) @ (abs(b) @ np.full(b.shape[1], 2.0))).max()
    np.testing.assert_array_equal(arrays["row_nnz"], np.diff(reference.indptr))
    np.testing.assert_allclose(arrays["row_sums"], reference @ np.ones(b.shape[1]), rtol=0,
                               atol=1e-12 * scale)
    np.testing.assert_allclose(arrays["row_weighted_sums"],
                               reference @ column_weights(np.arange(b.shape[1])), rtol=0,
                               atol=1e-12 * scale)
    rows = arrays["sample_rows"]
    assert len(rows) and np.all(np.diff(rows) > 0)
    _assert_matches(sp.csr_matrix((arrays["sample_data"], arrays["sample_indices"],
                                   arrays["sample_indptr"]), shape=(len(rows), b.shape[1])),
                    a[rows], b, 1e-12)


@pytest.mark.parametrize("nprocs", [2, 4])
def test_cpu_duplicate_heavy_keep_distributed(tmp_path, nprocs):
    a, b = _duplicate_heavy_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b),
                     {"keep_distributed": True, "sample_rows": 3}, backend="cpu")
    run, arrays = run_config(tmp_path, config, nprocs)
    attrs = run["attrs"]
    assert attrs["verify_passed"] and attrs["keep_distributed"]
    assert attrs["collected"] == "checksums" and attrs["sampled_rows"] <= 3 * nprocs
    _assert_checksums_match(arrays, a, b)


def test_cpu_c_identical_on_one_two_and_four_ranks(tmp_path):
    """Row-modulo, row-block and product-balanced pieces reassemble to the bytes of the
    one-rank C; the repeats record no gather, and the collect phase once."""
    a, b = _rectangular_pair()
    b_spec = _write_inputs(tmp_path, a, b)
    results = []
    for nprocs, strategy in ((1, "row_modulo"), (2, "row_modulo"), (4, "row_modulo"),
                             (3, "row_blocks"), (4, "product_balanced")):
        out = f"out_{nprocs}_{strategy}"
        config = write_config(tmp_path, "spgemm", {"b": b_spec}, name=f"{out}.yaml", out=out,
                              input={"path": str(tmp_path / "a.h5")}, backend="cpu",
                              partition={"strategy": strategy}, verify={"enabled": False})
        run, arrays = run_config(tmp_path, config, nprocs, out=out)
        assert run["attrs"]["collected"] == "full"  # C is small enough for /result
        assert "gather" not in run["phases"]
        collect = run["wall"][:, :, run["phases"].index("collect")]
        assert np.all(np.isfinite(collect[0])) and np.all(np.isnan(collect[1:]))
        results.append(arrays)
    for arrays in results[1:]:
        assert set(arrays) == set(results[0]) == {"indptr", "indices", "data"}
        for name in arrays:
            assert arrays[name].dtype == results[0][name].dtype
            np.testing.assert_array_equal(arrays[name], results[0][name])
    _assert_matches(_c_of(results[0], (310, 260)), a, b, 1e-12)


def test_cpu_large_c_unverified_is_not_gathered(tmp_path):
    a = _power_law()
    config = _config(tmp_path, _write_inputs(tmp_path, a), {"store_result_max_nnz": 1000},
                     backend="cpu", verify={"enabled": False})
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["collected"] == "checksums" and run["attrs"]["nnz_c"] > 1000
    _assert_checksums_match(arrays, a, a)


def test_cpu_rejects_mismatched_b(tmp_path):
    a, b = _rectangular_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b.T.tocsr()), backend="cpu")
    proc = run_config(tmp_path, config, 1, expect_rc=2)
    assert proc.returncode != 0
    assert "B has 260 rows but A has 200 columns" in proc.stderr


def test_benchmark_configs_keep_c_distributed_and_grow_weakly():
    """The strong-scaling 27-pt 128^3 and the weak-scaling R-MAT configs leave C on the GPUs,
    and a weak study grows the R-MAT scale by one per doubling of the ranks."""
    from hisparse.config import load_config
    from hisparse.jobs import weak_overrides
    configs = {name: load_config(str(ROOT / "inputs" / f"bench_spgemm_{name}.yaml"))
               for name in ("poisson27_128", "weak_rmat")}
    for config in configs.values():
        assert config["operation.name"] == "spgemm"
        assert config["operation.params"]["keep_distributed"] is True
    weak = configs["weak_rmat"]
    assert weak["input.generate"]["kind"] == "rmat" and weak["input.generate"]["scale"] == 18
    grown = [weak_overrides(weak, {"input.generate.scale": "log2"}, p, 1) for p in (2, 4, 8)]
    assert grown == [["input.generate.scale=19"], ["input.generate.scale=20"],
                     ["input.generate.scale=21"]]


def test_graph_benchmark_configs_name_their_conversion():
    """Each real-graph benchmark reads the HDF5 file its comment's ``hisparse convert`` writes
    from ../shared/data/matrices/graphs."""
    from hisparse.config import load_config
    for name in ("email_enron", "facebook", "wiki_vote", "luxembourg_osm"):
        path = ROOT / "inputs" / f"bench_spgemm_{name}.yaml"
        config = load_config(str(path))
        assert config["operation.name"] == "spgemm" and config["verify.enabled"]
        convert = [line.split() for line in path.read_text().splitlines()
                   if line.startswith("#") and "hisparse convert" in line]
        assert len(convert) == 1
        source, output = convert[0][-2:]
        assert source.startswith("../shared/data/matrices/graphs/")
        assert output == config["input.path"] == f"data/{name}.h5"


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
                                             (3, "row_blocks"), (4, "product_balanced"),
                                             (4, "flops_balanced")])
@pytest.mark.parametrize("bounded,graphs", [(None, True), (None, False), (False, True)])
def test_gpu_power_law_a_squared(tmp_path, nprocs, strategy, bounded, graphs):
    """C on every rank count, with the bounded-output pass (chosen for this small product;
    its repeat replayed as a CUDA graph or launched) or the symbolic pass; the GPU phases that
    ran are timed by events."""
    a = _power_law()
    config = _config(tmp_path, _write_inputs(tmp_path, a), {"bounded_output": bounded},
                     backend="gpu", partition={"strategy": strategy}, gpu={"graphs": graphs})
    run, arrays = run_config(tmp_path, config, nprocs)
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)
    assert run["attrs"]["bounded_output"] == (bounded is None)
    ran = ("numeric",) if bounded is None else ("binning", "symbolic", "numeric")
    timed = run["gpu"][:, :, [run["phases"].index(p) for p in ran]]
    assert np.all(np.isfinite(timed))
    if bounded is None:
        skipped = [run["phases"].index(p) for p in ("binning", "symbolic")]
        assert np.all(np.isnan(run["gpu"][:, :, skipped]))


@pytest.mark.gpu
@pytest.mark.parametrize("balanced,team_lanes", [(True, None), (False, None), (False, 1),
                                                 (False, 4), (False, 32)])
def test_gpu_balanced_and_per_row_walks(tmp_path, balanced, team_lanes):
    """Warps balanced over the products, or teams of ``team_lanes`` lanes per B row (null: from
    B's mean row length), in the shared tables (small tables too, so long rows reach the window
    and global kernels): the same C."""
    a = _power_law()
    for case, params in enumerate(({}, {"max_shared_table": 256},
                                   {"max_shared_table": 256, "dense_long_rows": False})):
        folder = tmp_path / str(case)
        folder.mkdir()
        config = _config(folder, _write_inputs(folder, a), backend="gpu",
                         params={"balanced_products": balanced, "team_lanes": team_lanes,
                                 **params})
        run, arrays = run_config(folder, config, 1)
        _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)
        if team_lanes is not None:
            assert run["attrs"]["team_lanes"] == team_lanes


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
@pytest.mark.parametrize("case,params,key", [
    ("long-rows-global", {"bounded_output": True}, "bounded_output"),
    ("long-rows-dense", {"bounded_output": True}, "bounded_output"),
    ("long-rows-dense-unsorted-b", {"window_search": True}, "window_search")])
def test_gpu_forced_paths_that_cannot_apply_name_their_key(tmp_path, case, params, key):
    """Asking for the bounded-output pass where rows need global tables, or for the window
    search on a B whose rows are not sorted, stops at the upload with the key named."""
    make, rows, case_params = ENGINE_CASES[case]
    a, b = make()
    local = _local_rows(a, b, rows, "int32")
    ctx = _engine_context(tmp_path, "gpu", {"b": "same", **case_params, **params})
    op = SpGEMM(ctx)
    engine = op.pick_engine(local)
    try:
        with pytest.raises(ConfigError, match=f"key 'operation.params.{key}': true"):
            op.upload(engine)
    finally:
        engine.free()
        ctx.device.release()


def test_kernel_plan_resolves_the_params_without_a_gpu(tmp_path):
    """The GPU engine's plan on an H100's limits, made on the host: the forced window search on
    unsorted B is refused (the operation's ConfigError), auto searches only sorted B, the
    dealt walk follows balanced_products, the bounded pass refuses the long rows (saying why
    when forced) and lays out the small window-row case."""
    limits = (232448, 132)
    for case, params, search, refused in (
            ("long-rows-dense", {"balanced_products": True}, True, False),
            ("long-rows-dense-unsorted-b", {"balanced_products": True}, False, False),
            ("long-rows-dense-unsorted-b", {"window_search": True}, False, True),
            ("long-rows-dense-unbalanced", {"balanced_products": False}, True, False)):
        make, rows, _ = ENGINE_CASES[case]
        a, b = make()
        local = _local_rows(a, b, rows, "int32")
        ctx = _engine_context(tmp_path, "cpu", {"b": "same", **params})
        plan = plan_kernels(local, ctx.config["operation.params"], *limits)
        assert plan.window_search == search and plan.search_refused == refused
        assert plan.balanced == bool(params.get("balanced_products", False))
        assert plan.n_rows == len(rows) and plan.target_warps == 32 * 132
        assert plan.sym_counts.sum() == np.count_nonzero(local.products)
        assert plan_bounded(local.products, plan, None, None, 1 << 34) == (None, None)
        layout, why = plan_bounded(local.products, plan, True, None, 1 << 34)
        assert layout is None and ("symbolic pass" in why or "one block packs" in why)
    a, b = _window_row_pair()
    local = _local_rows(a, b, np.arange(16), "int64")
    ctx = _engine_context(tmp_path, "cpu", {"b": "same"})
    plan = plan_kernels(local, ctx.config["operation.params"], *limits)
    layout, why = plan_bounded(local.products, plan, None, None, 1 << 34)
    bound = np.minimum(local.products, b.shape[1])
    assert why is None and layout.total == bound.sum()
    assert sorted(layout.order.tolist()) == np.flatnonzero(bound).tolist()
    assert layout.counts.sum() == np.count_nonzero(bound)
    assert plan_bounded(local.products, plan, True, 4, 1 << 34) == (None, "operation.params."
                                                                   "chunk_rows asks for row "
                                                                   "chunks")


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
@pytest.mark.parametrize("chunk_rows", [None, 50])
def test_gpu_duplicate_heavy_keep_distributed(tmp_path, chunk_rows):
    """C left on the GPUs (or, in chunks, on the hosts): checksums from the device kernel."""
    a, b = _duplicate_heavy_pair()
    config = _config(tmp_path, _write_inputs(tmp_path, a, b),
                     {"keep_distributed": True, "chunk_rows": chunk_rows}, backend="gpu")
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["verify_passed"] and run["attrs"]["collected"] == "checksums"
    assert run["attrs"]["chunked"] == (chunk_rows is not None)
    _assert_checksums_match(arrays, a, b)


@pytest.mark.gpu
def test_gpu_c_stays_on_the_device(tmp_path):
    """No copy of C in the repeats (d2h not recorded), C gathered whole in collect (memory
    staying flat across repeats is checked on the engine)."""
    a = _power_law()
    config = _config(tmp_path, _write_inputs(tmp_path, a), backend="gpu",
                     run={"repeats": 3, "warmup": 1})
    run, arrays = run_config(tmp_path, config, 2)
    assert run["attrs"]["collected"] == "full" and not run["attrs"]["chunked"]
    assert np.all(np.isnan(run["wall"][:, :, run["phases"].index("d2h")]))
    _assert_matches(_c_of(arrays, a.shape), a, a, 1e-12)


def test_product_weighted_row_length_is_the_mean_over_products():
    """Each product a_ik b_kj counted once, the mean length of the B row it lies on (this test's
    own walk over the products); a strided sample of A's entries approximates it."""
    a = _power_law()
    csr = a.tocsr()
    walked = [csr.indptr[k + 1] - csr.indptr[k] for k in csr.indices
              for _ in range(csr.indptr[k + 1] - csr.indptr[k])]
    exact = product_weighted_row_length(csr.indices, csr.indptr, sample=len(csr.indices))
    assert exact == pytest.approx(np.mean(walked), rel=1e-12)
    assert exact > 2 * csr.nnz / csr.shape[0]  # power law: products meet the long rows
    sampled = product_weighted_row_length(csr.indices, csr.indptr, sample=len(csr.indices) // 4)
    assert sampled == pytest.approx(exact, rel=0.5)
    assert product_weighted_row_length(np.zeros(0, np.int32), csr.indptr) == 1.0


def test_rows_sorted_checks_each_row_not_across_rows(monkeypatch):
    """Strictly increasing columns within every row; a row may start below the last one's end;
    a repeated column or a descent inside a row is unsorted."""
    csr = _power_law().tocsr()
    csr.sort_indices()
    assert rows_sorted(csr.indptr, csr.indices)
    _, unsorted = _long_row_pair_unsorted_b()
    assert not rows_sorted(unsorted.indptr, unsorted.indices)
    indptr = np.array([0, 2, 2, 4])
    assert rows_sorted(indptr, np.array([3, 5, 0, 1]))
    assert not rows_sorted(indptr, np.array([3, 3, 0, 1]))
    assert not rows_sorted(indptr, np.array([3, 5, 1, 0]))
    assert rows_sorted(np.array([0, 0]), np.zeros(0, np.int32))
    # in pieces (threads) smaller than a row: the answer does not change at their boundaries
    from hisparse import threads
    for piece in (1, 2, 3, 7):
        monkeypatch.setattr(threads, "REDUCE_PIECE", piece)
        assert rows_sorted(csr.indptr, csr.indices)
        assert not rows_sorted(unsorted.indptr, unsorted.indices)
        assert rows_sorted(indptr, np.array([3, 5, 0, 1]))
        assert not rows_sorted(indptr, np.array([3, 3, 0, 1]))
        assert not rows_sorted(indptr, np.array([3, 5, 1, 0]))


def test_skewed_rows_tells_power_law_from_uniform_b():
    """A hub row holding most products is skewed; a stencil's equal rows are not; in between,
    the rule is the product-weighted length against SKEW_RATIO x the mean."""
    n = 1000
    star = sp.lil_matrix((n, n))
    star[0, :] = 1.0  # one hub row
    star[np.arange(1, n), np.arange(1, n)] = 1.0
    star = star.tocsr()
    assert skewed_rows(star.indices, star.indptr)
    stencil = sp.diags([1.0, 2.0, 1.0], [-1, 0, 1], shape=(300, 300)).tocsr()
    assert not skewed_rows(stencil.indices, stencil.indptr)
    assert not skewed_rows(np.zeros(0, np.int32), stencil.indptr)
    graph = _power_law().tocsr()
    ratio = product_weighted_row_length(graph.indices, graph.indptr) / (graph.nnz / graph.shape[0])
    assert skewed_rows(graph.indices, graph.indptr) == (ratio >= SKEW_RATIO)

"""CSR5 SpMV: the NumPy builder against a plain-loop definition of the format, the NumPy CSR5
product, the CSR5 engines (CPU vs GPU on the same local data) and the GPU conversion + kernel
against SciPy, on the edge cases of the format."""
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.errors import HisparseError
from hisparse.formats import CSRMatrix
from hisparse.formats._csr import uniform_value
from hisparse.formats._csr5 import (build_csr5, csr5_spmv, csr5_spmv_compiled,
                                     decode_tile_desc, default_sigma, descriptor_layout,
                                     row_length_census, CENSUS_ROWS, MAX_SIGMA)
from hisparse.io import write_matrix
from hisparse.ops.spmv import SpmvLocal

from helpers import run_config, write_config
from test_spmv import (BACKENDS, assert_close_to_product, check_engines_agree, power_chain,
                       run_x)
from test_spmv import gpu_device as bound_gpu

gpu_device = bound_gpu  # the module-scoped GPU fixture, for this file's GPU tests too

OMEGA = 32


# -- test matrices --------------------------------------------------------------------------------

def _from_lengths(lengths, ncols, seed=0):
    """A CSR matrix with the given row lengths, distinct random columns, random values."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([rng.choice(ncols, size=k, replace=False) for k in lengths]) \
        if lengths.sum() else np.zeros(0, dtype=np.int64)
    values = rng.uniform(-1.0, 1.0, size=len(rows))
    return sp.csr_matrix((values, (rows, cols)), shape=(len(lengths), ncols))


def _case(name, sigma):
    """The edge cases of the issue, sized relative to the tile (32 * sigma entries)."""
    tile = OMEGA * sigma
    rng = np.random.default_rng(len(name) * 31 + sigma)
    if name == "empty_start_end_runs":
        lengths = rng.integers(0, 12, size=700)
        lengths[:5] = 0
        lengths[-7:] = 0
        lengths[300:340] = 0
        return _from_lengths(lengths, 500, seed=1)
    if name == "empty_inside_tiles":
        lengths = np.where(np.arange(4 * tile) % 3 == 0, 1, 0)  # two empty rows after each row
        lengths[7:40] = 0
        return _from_lengths(lengths, 60, seed=2)
    if name == "empty_at_tile_boundaries":
        # Rows that end exactly at tile boundaries, followed by runs of empty rows, and a row
        # starting exactly at the next tile.
        lengths = [tile, 0, 0, tile // 2, tile - tile // 2, 0, tile, 0, 0, 0, 3, tile - 3, 0, 1]
        return _from_lengths(lengths, max(tile, 64), seed=3)
    if name == "long_row":
        lengths = rng.integers(0, 6, size=400)
        lengths[150] = 20 * tile + 5  # spans about 20 tiles
        return _from_lengths(lengths, 21 * tile, seed=4)
    if name == "dense_first_row":
        lengths = np.ones(300, dtype=np.int64)
        lengths[0] = 7 * tile
        return _from_lengths(lengths, 7 * tile, seed=5)
    if name == "smaller_than_tile":
        return _from_lengths([2, 0, 3, 1, 0], 7, seed=6)
    if name == "exact_multiple":
        lengths = np.full(3 * tile // 4, 4)  # nnz = 3 tiles exactly, no tail
        return _from_lengths(lengths, 50, seed=7)
    if name == "exact_multiple_trailing_empty":
        lengths = np.concatenate([np.full(2 * tile // 2, 2), np.zeros(9, dtype=np.int64)])
        return _from_lengths(lengths, 50, seed=8)
    if name == "rectangular_wide":
        return _from_lengths(rng.integers(0, 40, size=150), 2000, seed=9)
    if name == "rectangular_tall":
        return _from_lengths(rng.integers(0, 4, size=3000), 5, seed=10)
    if name == "all_zero":
        return sp.csr_matrix((40, 30))
    if name == "long_empty_runs":
        # Runs of empty rows longer than Csr5Device.WIDE_SPAN (1024) inside tiles, one exactly
        # that long, one a row longer, and one after a row that ends at a tile boundary: the
        # product zeroes the long ones with a thread per row, the others in their tile's warp.
        pieces = [rng.integers(1, 6, size=90), np.zeros(3000, np.int64), [tile],
                  np.zeros(1025, np.int64), rng.integers(1, 6, size=70),
                  np.zeros(1024, np.int64), [2], np.zeros(5000, np.int64),
                  rng.integers(0, 6, size=300)]
        lengths = np.concatenate([np.asarray(piece, dtype=np.int64) for piece in pieces])
        return _from_lengths(lengths, 3 * tile, seed=11)
    if name == "many_tiles":
        # About 2100 tiles: the GPU's scan over the tiles (offset_ptr, calibration chains) takes
        # them in several blocks (512 each), and the 150 rows of 1 to 6 tiles make chains cross
        # the blocks; a tenth of the rows are empty, so many tiles have empty rows.
        lengths = rng.integers(0, 40, size=91 * tile)
        lengths[rng.random(len(lengths)) < 0.1] = 0
        lengths[rng.choice(len(lengths), size=150, replace=False)] = rng.integers(
            tile, 6 * tile, size=150)
        ncols = 6 * tile
        rows = np.repeat(np.arange(len(lengths)), lengths)
        within = np.arange(len(rows)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        cols = (within + rng.integers(0, ncols, size=len(lengths))[rows]) % ncols
        return sp.csr_matrix((rng.uniform(-1.0, 1.0, size=len(rows)), (rows, cols)),
                             shape=(len(lengths), ncols))
    raise KeyError(name)


CASES = ["empty_start_end_runs", "empty_inside_tiles", "empty_at_tile_boundaries", "long_row",
         "dense_first_row", "smaller_than_tile", "exact_multiple",
         "exact_multiple_trailing_empty", "rectangular_wide", "rectangular_tall", "all_zero",
         "many_tiles", "long_empty_runs"]


def _csr(matrix, index_dtype=np.int32, value_dtype=np.float64):
    return CSRMatrix.from_scipy(matrix).astype(value_dtype, index_dtype)


# -- the format, checked entry by entry with plain loops ---------------------------------------

@pytest.mark.parametrize("sigma", [1, 3, 8, 16, 32])
@pytest.mark.parametrize("name", ["empty_start_end_runs", "empty_at_tile_boundaries",
                                  "empty_inside_tiles", "long_row", "exact_multiple"])
def test_builder_matches_the_format_definition(name, sigma):
    matrix = _case(name, sigma)
    csr = _csr(matrix)
    csr5 = build_csr5(csr, sigma)
    indptr = [int(v) for v in csr.indptr]
    m, nnz, tile = matrix.shape[0], matrix.nnz, OMEGA * sigma
    p = nnz // tile
    assert csr5.num_tiles == p and csr5.tail_start == p * tile
    row_starts = {indptr[r] for r in range(m) if indptr[r + 1] > indptr[r]}

    def row_of(position):  # the last row whose pointer is <= position
        return max(r for r in range(m + 1) if indptr[r] <= position) if position < nnz else m

    y_offset, seg_offset, bit_flag = decode_tile_desc(csr5)
    bit_y, num_packet = descriptor_layout(sigma)
    assert csr5.tile_desc.shape == (p, num_packet, OMEGA)
    empty_flag = np.iinfo(np.int32).min
    for t in range(p):
        first, last = row_of(t * tile), row_of((t + 1) * tile)
        inside_empty = any(indptr[r] == indptr[r + 1] for r in range(first + 1, last))
        assert int(csr5.tile_ptr[t]) == (first | empty_flag if inside_empty else first)
        opened_before = 0
        for lane in range(OMEGA):
            positions = [t * tile + lane * sigma + i for i in range(sigma)]
            flags = [q in row_starts for q in positions]
            assert list(bit_flag[t, lane]) == flags
            for i, q in enumerate(positions):  # transposed storage
                assert csr5.col_idx[t * tile + i * OMEGA + lane] == csr.indices[q]
                assert csr5.val[t * tile + i * OMEGA + lane] == csr.data[q]
            assert y_offset[t, lane] == opened_before
            opened_before += sum(flags) + (1 if lane == 0 and not flags[0] else 0)
        # seg_offset: lanes after this one that open no segment.
        opens = [bit_flag[t, lane].any() or lane == 0 for lane in range(OMEGA)]
        for lane in range(OMEGA):
            following = 0
            while lane + following + 1 < OMEGA and not opens[lane + following + 1]:
                following += 1
            assert seg_offset[t, lane] == following
        if inside_empty:
            # Segment j -> row: the tile's first row, then the rows starting inside the tile.
            expected = [first] + [r for r in range(first + 1, m) if indptr[r] in row_starts
                                  and t * tile < indptr[r] < (t + 1) * tile
                                  and indptr[r + 1] > indptr[r]]
            start, stop = csr5.offset_ptr[t], csr5.offset_ptr[t + 1]
            assert list(csr5.empty_offset[start:stop]) == expected
        else:
            assert csr5.offset_ptr[t + 1] == csr5.offset_ptr[t]
    assert int(csr5.tile_ptr[p]) == row_of(p * tile)
    np.testing.assert_array_equal(csr5.col_idx[p * tile:], csr.indices[p * tile:])


def test_default_sigma_and_descriptor_layout():
    assert default_sigma(5) == 16 and default_sigma(27) == 27 and default_sigma(500) == 32
    # bit_y = ceil(log2(32 * sigma)); y_offset + seg_offset + sigma flags in 32-bit packets.
    assert descriptor_layout(16) == (9, 1)
    assert descriptor_layout(27) == (10, 2)
    assert descriptor_layout(4) == (7, 1)
    with pytest.raises(Exception, match="sigma"):
        descriptor_layout(33)


def _stencil27(nx, ny, nz):
    """The 27-point stencil's pattern on an nx x ny x nz grid (Kronecker products of 3-point
    bands), in SciPy: an independent reference for the generator's matrices."""
    bands = [sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(n, n)) for n in (nz, ny, nx)]
    return sp.kron(sp.kron(bands[0], bands[1]), bands[2]).tocsr()


def test_default_sigma_takes_the_length_most_rows_share():
    # a slab whose mean row length rounds to 23, though 63 % of its rows hold 27 entries
    slab = _stencil27(24, 24, 8)
    lengths = np.diff(slab.indptr)
    values, counts = np.unique(lengths, return_counts=True)
    assert values[np.argmax(counts)] == 27 and 2 * counts.max() >= len(lengths)
    assert round(slab.nnz / slab.shape[0]) == 23
    census = row_length_census(slab.indptr)
    assert census.sum() == len(lengths)
    assert default_sigma(slab.nnz / slab.shape[0], census) == 27
    assert default_sigma(slab.nnz / slab.shape[0]) == 23  # without the census: the mean's
    # no length shared by half the rows: the mean rule (rounded, clamped to [16, 32])
    rng = np.random.default_rng(3)
    spread = np.r_[0, np.cumsum(rng.integers(1, 41, 5000))]
    assert default_sigma(spread[-1] / 5000, row_length_census(spread)) == \
        round(spread[-1] / 5000)
    # the common length outside [16, 32] (a 7-point stencil's; rows longer than 32): the clamp
    short = np.arange(0, 7 * 1000 + 1, 7)
    assert default_sigma(7.0, row_length_census(short)) == 16
    long = np.arange(0, 40 * 1000 + 1, 40)
    assert default_sigma(40.0, row_length_census(long)) == MAX_SIGMA
    assert row_length_census(long)[-1] == 1000  # longer than MAX_SIGMA: the last bin


def test_row_length_census_samples_evenly_spaced_rows():
    rng = np.random.default_rng(4)
    n = 3 * CENSUS_ROWS + 17
    lengths = rng.integers(0, 40, n)
    indptr = np.r_[0, np.cumsum(lengths)]
    step = n // CENSUS_ROWS
    sampled = lengths[::step]
    want = np.array([np.count_nonzero(sampled == k) for k in range(MAX_SIGMA + 1)] +
                    [np.count_nonzero(sampled > MAX_SIGMA)])
    np.testing.assert_array_equal(row_length_census(indptr), want)


# -- the NumPy CSR5 product against SciPy ------------------------------------------------------

@pytest.mark.parametrize("sigma", [1, 4, 13, 32])
@pytest.mark.parametrize("name", CASES)
def test_numpy_csr5_spmv_matches_scipy(name, sigma):
    matrix = _case(name, sigma)
    x = np.random.default_rng(1).uniform(-1, 1, matrix.shape[1])
    y = csr5_spmv(build_csr5(_csr(matrix), sigma), x)
    assert_close_to_product(y, matrix, x, 1e-13)
    if matrix.nnz == 0:
        assert np.all(y == 0)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("value_dtype,rtol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_numpy_csr5_dtypes(index_dtype, value_dtype, rtol):
    matrix = _case("empty_start_end_runs", 4)
    csr = _csr(matrix, index_dtype, value_dtype)
    csr5 = build_csr5(csr, 4)
    assert csr5.col_idx.dtype == index_dtype and csr5.tile_ptr.dtype == index_dtype
    assert csr5.val.dtype == value_dtype
    x = np.random.default_rng(2).uniform(-1, 1, matrix.shape[1]).astype(value_dtype)
    y = csr5_spmv(csr5, x)
    assert y.dtype == value_dtype
    assert_close_to_product(y, matrix.astype(value_dtype), x, rtol)


# -- engines agree: the CSR5 engine of each backend against the CPU engine and SciPy ------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sigma", [4, 32])
@pytest.mark.parametrize("name", CASES)
def test_csr5_engines_agree_on_edge_cases(tmp_path, request, backend, name, sigma):
    csr = _csr(_case(name, sigma))
    x = np.random.default_rng(5).uniform(-1, 1, csr.ncols)
    check_engines_agree(tmp_path, request, backend, SpmvLocal(csr, x, sigma=sigma), 1e-13,
                        format="csr5", sigma=sigma)


# -- the operation end to end (CPU backend) ----------------------------------------------------

def _config(tmp_path, input_path, params, **sections):
    """A CSR5 run of ``input_path`` with ``params`` added to ``x: random, format: csr5``."""
    return write_config(tmp_path, "spmv", {"x": "random", "format": "csr5", **params},
                        input={"path": str(input_path)}, **sections)


def _write_case(tmp_path, name, sigma):
    matrix = _case(name, sigma)
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(matrix))
    return matrix, path


@pytest.mark.parametrize("nprocs", [1, 3])
def test_csr5_cpu_run_matches_scipy(tmp_path, nprocs):
    matrix, input_path = _write_case(tmp_path, "empty_start_end_runs", 4)
    cfg = _config(tmp_path, input_path, {"sigma": 4, "iterations": 2}, backend="cpu")
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["verify_passed"]
    assert run["attrs"]["csr5_sigma"] == 4
    assert run["attrs"]["csr5_convert_spmv_equivalents"] > 0
    assert list(run["rank_vars"]["csr5_sigma"]) == [4] * nprocs
    assert_close_to_product(arrays["y"], matrix, run_x(matrix.shape[1]), 1e-13)


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_csr5_run_takes_the_row_length_most_rows_share(tmp_path, nprocs):
    """sigma left to the default on a 27-point slab (mean row length 23.4): 27 on every rank,
    the census summed over the ranks; the product still verified."""
    path = tmp_path / "slab.h5"
    slab = _stencil27(24, 24, 8)
    write_matrix(path, CSRMatrix.from_scipy(slab))
    cfg = _config(tmp_path, path, {"iterations": 2}, backend="cpu")
    run, _ = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["verify_passed"]
    assert list(run["rank_vars"]["csr5_sigma"]) == [27] * nprocs


def test_csr5_sigma_out_of_range_is_a_config_error(tmp_path):
    _, input_path = _write_case(tmp_path, "smaller_than_tile", 4)
    cfg = _config(tmp_path, input_path, {"sigma": 40}, backend="cpu")
    proc = run_config(tmp_path, cfg, expect_rc=2)
    assert "operation.params.sigma" in proc.stderr and "[1, 32]" in proc.stderr


# -- uniform values: one value for every nonzero ------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_uniform_value_only_when_every_value_is_the_same_finite_number(dtype):
    same = np.full(1000, 0.75, dtype=dtype)
    found = uniform_value(same)
    assert found.dtype == dtype and found.tolist() == [0.75]
    for bad in (-1.0, np.nan, np.inf):
        differ = same.copy()
        differ[517] = bad
        assert uniform_value(differ) is None, bad
    assert uniform_value(np.full(5, np.inf, dtype=dtype)) is None  # not finite
    assert uniform_value(np.zeros(0, dtype=dtype)) is None
    assert uniform_value(np.full(3, -0.0, dtype=dtype)).tolist() == [0.0]


#: a small R-MAT graph: every stored value is 1, square (the products chain), power-law rows
RMAT = {"kind": "rmat", "scale": 11, "edge_factor": 8, "seed": 1}


def _uniform_run(tmp_path, nprocs, backend, odd_value=None, odd_where="rows", **params):
    """A chained CSR5 run (3 products) of :data:`RMAT`, generated, or written to a file with some
    nonzeros set to ``odd_value``: with ``odd_where="rows"`` those of the second half of the
    rows (with 3 ranks, the first rank's blocks hold only 1s and the last rank's local block
    only ``odd_value``s); with ``"ghost"`` those of the last tenth of the rows in the first
    tenth of the columns (with 3 ranks every local block holds only 1s: the odd values are in
    the last rank's ghost block). Returns the run, its y and the chain's y from SciPy."""
    from hisparse import generators
    matrix = generators.rmat(RMAT["scale"], RMAT["edge_factor"], seed=RMAT["seed"]).to_scipy()
    source = {"generate": RMAT}
    if odd_value is not None:
        n = matrix.shape[0]
        if odd_where == "rows":
            matrix.data[matrix.indptr[n // 2]:] = odd_value
        else:
            rows = np.repeat(np.arange(n), np.diff(matrix.indptr))
            odd = (rows >= n - n // 10) & (matrix.indices < n // 10)
            assert odd.any()
            matrix.data[odd] = odd_value
        source = {"path": str(tmp_path / "a.h5")}
        write_matrix(source["path"], CSRMatrix.from_scipy(matrix))
    cfg = write_config(tmp_path, "spmv", {"x": "random", "format": "csr5", "iterations": 3,
                                          **params}, input=source, backend=backend)
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["verify_passed"]
    return run, arrays["y"], power_chain(matrix, run_x(matrix.shape[0]), 3)


@pytest.mark.parametrize("nprocs,odd_value,odd_where", [(1, None, "rows"), (3, None, "rows"),
                                                       (3, -1.0, "rows"), (3, 2.0, "ghost")])
def test_uniform_values_agree_over_the_ranks(tmp_path, nprocs, odd_value, odd_where):
    """The ranks agree on one value for the whole matrix, ghost blocks included, or on none
    when one rank's values differ (the run records which); the chain's y is SciPy's either
    way."""
    run, y, reference = _uniform_run(tmp_path, nprocs, "cpu", odd_value, odd_where)
    assert bool(run["attrs"]["uniform_values"]) == (odd_value is None)
    np.testing.assert_allclose(y, reference, rtol=1e-12, atol=1e-12)


# -- GPU: conversion must reproduce the NumPy builder exactly; products against SciPy ----------

def _gpu_convert(csr, sigma, narrow=None, uniform=False):
    """A :class:`Csr5Device` holding ``csr`` converted on the GPU (its own arena and stream);
    ``uniform``: with the one value of ``csr`` instead of its values array."""
    import pycuda.driver as cuda
    from hisparse.gpu import DeviceArena, Kernels, load_module
    from hisparse.gpu import CSR5_KERNELS, Csr5Device, csr5_defines
    value = uniform_value(csr.data) if uniform else None
    assert (value is not None) == uniform
    defines = csr5_defines(csr, sigma, narrow, uniform)
    kernels = Kernels(load_module("spmv_csr5", defines), CSR5_KERNELS.signatures(defines))
    arena = DeviceArena("test_spmv_csr5")
    device = Csr5Device(kernels, csr, sigma, cuda.Stream(), arena, narrow, uniform=value)
    data = csr.data if value is None else value
    device.convert(*(arena.to_device(array) for array in (csr.indptr, csr.indices, data)))
    return device


def _gpu_products(device, x, repeats):
    import pycuda.gpuarray as gpuarray
    x_dev = gpuarray.to_gpu(x)
    ys = []
    for _ in range(repeats):
        # Poison y: the product must write every entry (no zeroing assumed).
        y_dev = gpuarray.to_gpu(np.full(max(device.m, 1), np.nan, dtype=x.dtype))
        device.multiply(x_dev, y_dev)
        device.stream.synchronize()
        ys.append(y_dev.get()[:device.m])
    return ys


def _assert_products(device, matrix, x, rtol, repeats=3):
    """``repeats`` products of ``device`` (converted ``matrix``): SciPy's within ``rtol``, and
    bit for bit the same each time."""
    ys = _gpu_products(device, x, repeats)
    assert_close_to_product(ys[0], matrix, x, rtol)
    for y in ys[1:]:
        assert np.array_equal(y, ys[0])  # bitwise identical


def _assert_same_format(gpu, ref):
    for name in ("tile_ptr", "tile_desc", "col_idx", "val", "offset_ptr", "empty_offset",
                 "chain_row", "chain_first", "chain_last"):
        got, want = getattr(gpu, name), getattr(ref, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)


# (sigma, index dtype, value dtype, rtol, narrow): narrow None = 16-bit product columns on
# these small matrices, False = the index dtype
GPU_VARIANTS = [(4, np.int32, np.float64, 1e-13, None), (32, np.int32, np.float64, 1e-13, None),
                (4, np.int32, np.float32, 2e-5, None), (7, np.int64, np.float64, 1e-13, None),
                (4, np.int32, np.float64, 1e-13, False), (7, np.int64, np.float32, 2e-5, False)]


def test_csr5_column_dtype_rule():
    """16-bit product columns where every column index fits, the index dtype otherwise; asking
    for 16 bits on too many columns is an error naming the key."""
    from hisparse.gpu import NARROW_COLUMNS_MAX, csr5_column_dtype, csr5_defines
    fits = CSRMatrix.from_scipy(sp.random(3, NARROW_COLUMNS_MAX, density=0.001, format="csr",
                                          random_state=1))
    wide = CSRMatrix.from_scipy(sp.random(3, NARROW_COLUMNS_MAX + 1, density=0.001,
                                          format="csr", random_state=1))
    assert csr5_column_dtype(fits) == np.uint16
    assert csr5_defines(fits, 8)["COL_T"] == "unsigned short"
    assert csr5_column_dtype(fits, narrow=False) == fits.indices.dtype
    assert "COL_T" not in csr5_defines(fits, 8, narrow=False)
    assert csr5_column_dtype(wide) == wide.indices.dtype
    with pytest.raises(HisparseError, match="narrow_columns.*65,537"):
        csr5_column_dtype(wide, narrow=True)


@pytest.mark.gpu
@pytest.mark.parametrize("sigma,index_dtype,value_dtype,rtol,narrow", GPU_VARIANTS)
@pytest.mark.parametrize("name", CASES)
def test_gpu_csr5_conversion_and_product(gpu_device, name, sigma, index_dtype, value_dtype,
                                         rtol, narrow):
    matrix = _case(name, sigma)
    csr = _csr(matrix, index_dtype, value_dtype)
    device = _gpu_convert(csr, sigma, narrow)
    try:
        assert device.arrays["col"].dtype == (np.uint16 if narrow is None else index_dtype)
        _assert_same_format(device.to_host(), build_csr5(csr, sigma))
        x = np.random.default_rng(3).uniform(-1, 1, matrix.shape[1]).astype(value_dtype)
        _assert_products(device, matrix.astype(value_dtype), x, rtol)
    finally:
        device.free()


@pytest.mark.gpu
@pytest.mark.parametrize("value_dtype,rtol", [(np.float64, 1e-13), (np.float32, 2e-5)])
@pytest.mark.parametrize("name", CASES)
def test_gpu_csr5_uniform_values(gpu_device, name, value_dtype, rtol):
    """Every nonzero -1.5: the format holds the value once, equals the builder's (values
    expanded) and multiplies like SciPy, bit for bit from product to product."""
    matrix = _case(name, 7).tocsr()
    matrix.data[:] = -1.5
    csr = _csr(matrix, np.int32, value_dtype)
    if not csr.nnz:
        return  # no value to share (uniform_value: None); the plain path covers it
    device = _gpu_convert(csr, 7, uniform=True)
    try:
        assert device.arrays["val"].size == 1
        _assert_same_format(device.to_host(), build_csr5(csr, 7))
        x = np.random.default_rng(3).uniform(-1, 1, matrix.shape[1]).astype(value_dtype)
        _assert_products(device, matrix.astype(value_dtype), x, rtol)
    finally:
        device.free()


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs,params", [(1, {"reorder": "degree"}), (2, {}),
                                           (2, {"uniform_values": False}),
                                           (1, {"format": "csr"}), (2, {"format": "csr"})])
def test_gpu_uniform_run(tmp_path, nprocs, params):
    """A graph end to end on the GPU, CSR5 or CSR-vector: the ranks keep its one value (unless
    told not to) and the chain is SciPy's."""
    run, y, reference = _uniform_run(tmp_path, nprocs, "gpu", **params)
    assert bool(run["attrs"]["uniform_values"]) == params.get("uniform_values", True)
    np.testing.assert_allclose(y, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["csr5", "csr"])
def test_gpu_ghost_values_differ(tmp_path, fmt):
    """Every local block holds only 1s, the last rank's ghost block 2s as well: the ranks keep
    the values arrays, and the chain is SciPy's."""
    run, y, reference = _uniform_run(tmp_path, 3, "gpu", 2.0, "ghost", format=fmt)
    assert not run["attrs"]["uniform_values"]
    np.testing.assert_allclose(y, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("uniform", [False, True])
def test_gpu_csr5_rows_spanning_many_tiles(gpu_device, uniform):
    """Rows of 33 to 150 tiles (long calibration chains, a warp each), next to each other and
    among hundreds of rows crossing one tile boundary: SciPy's product, bit for bit from product
    to product."""
    sigma, tile = 4, OMEGA * 4
    rng = np.random.default_rng(8)
    lengths = rng.integers(0, 300, size=600)
    lengths[[3, 5, 6, 40, 41, 300]] = [150 * tile, 33 * tile + 1, 40 * tile - 7, 34 * tile,
                                       80 * tile, 60 * tile]
    matrix = _from_lengths(lengths, 150 * tile + 10, seed=9)
    if uniform:
        matrix.data[:] = 0.5
    csr = _csr(matrix)
    device = _gpu_convert(csr, sigma, uniform=uniform)
    try:
        chains = device.to_host()
        spans = chains.chain_last - chains.chain_first + 1
        assert spans.max() > 140 and (spans > 32).sum() >= 5 and (spans <= 32).sum() > 100
        _assert_products(device, matrix, np.random.default_rng(4).uniform(-1, 1, matrix.shape[1]),
                         1e-13)
    finally:
        device.free()


@pytest.mark.gpu
def test_gpu_csr5_power_law_bitwise_repeatable(gpu_device):
    """Long rows spanning many tiles (many calibrator terms per row): repeated products agree
    bit for bit and with SciPy."""
    from hisparse.generators import random_matrix
    csr = random_matrix(20000, nnz_per_row=12, seed=5, power_law=1.1)
    matrix = csr.to_scipy()
    device = _gpu_convert(csr, 16)
    try:
        _assert_same_format(device.to_host(), build_csr5(csr, 16))
        _assert_products(device, matrix, np.random.default_rng(4).uniform(-1, 1, matrix.shape[1]),
                         1e-13, repeats=5)
    finally:
        device.free()


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs,precision,index_width", [(1, "fp64", "int32"),
                                                           (2, "fp32", "int64")])
def test_gpu_csr5_run_matches_scipy(tmp_path, nprocs, precision, index_width):
    matrix, input_path = _write_case(tmp_path, "long_row", 16)
    cfg = _config(tmp_path, input_path, {"iterations": 3}, backend="gpu", precision=precision,
                  index_width=index_width)
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["backend"] == "gpu" and run["attrs"]["verify_passed"]
    convert = run["phases"].index("convert")
    assert np.isfinite(run["gpu"][0, :, convert]).all()
    y = arrays["y"]
    x = run_x(matrix.shape[1])
    if precision == "fp32":
        x = x.astype(np.float32)
        assert_close_to_product(y, matrix.astype(np.float32), x, 2e-5)
    else:
        assert_close_to_product(y, matrix, x, 1e-13)


# -- the compiled CPU product against the NumPy one ---------------------------------------------

@pytest.mark.parametrize("sigma", [1, 4, 13, 16, 32])
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("index_dtype,value_dtype", [(np.int32, np.float64),
                                                     (np.int64, np.float32)])
def test_compiled_csr5_product_equals_numpys(name, sigma, index_dtype, value_dtype):
    """The compiled product (tiles on one core, and on several) gives the NumPy product's bits
    on every edge case; both agree with SciPy."""
    from hisparse.formats import _csr5
    matrix = _case(name, sigma)
    csr5 = build_csr5(_csr(matrix, index_dtype, value_dtype), sigma)
    x = np.random.default_rng(7).uniform(-1, 1, matrix.shape[1]).astype(value_dtype)
    want = csr5_spmv(csr5, x)
    for parallel_from in (1 << 40, 0):  # one core, then every core
        _csr5.PARALLEL_MIN_ENTRIES, saved = parallel_from, _csr5.PARALLEL_MIN_ENTRIES
        try:
            got = csr5_spmv_compiled(csr5, x)
        finally:
            _csr5.PARALLEL_MIN_ENTRIES = saved
        assert got.dtype == value_dtype
        np.testing.assert_array_equal(got, want)
    rtol = 1e-13 if value_dtype == np.float64 else 1e-5
    assert_close_to_product(want, matrix.astype(value_dtype), x, rtol)


def test_compiled_csr5_product_long_chain():
    """A row spanning many tiles (a chain of many calibrator terms, summed in order by both):
    the NumPy product's bits, and SciPy's product within rounding."""
    lengths = np.full(40, 3)
    lengths[7] = 32 * 4 * 30  # 30 tiles of sigma 4
    matrix = _from_lengths(lengths, 5000, seed=3)
    csr5 = build_csr5(_csr(matrix), 4)
    assert int(np.max(csr5.chain_last.astype(np.int64) - csr5.chain_first + 1)) > 8
    x = np.random.default_rng(8).uniform(-1, 1, matrix.shape[1])
    got = csr5_spmv_compiled(csr5, x)
    np.testing.assert_array_equal(got, csr5_spmv(csr5, x))
    assert_close_to_product(got, matrix, x, 1e-13)


@pytest.mark.gpu
@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("name", ["empty_start_end_runs", "long_row", "smaller_than_tile"])
def test_gpu_csr5_product_into_mapped_rows(gpu_device, name, uniform):
    """``multiply(x, y, rows)`` adds each row's product into ``y[rows[r]]`` (the ghost block of
    a distributed product) and leaves the other entries of y as they were, bit for bit the
    same on repeats."""
    import pycuda.gpuarray as gpuarray
    matrix = _case(name, 4)
    if uniform:
        matrix.data[:] = 1.0
    csr = _csr(matrix)
    device = _gpu_convert(csr, 4, uniform=uniform)
    rng = np.random.default_rng(9)
    m = matrix.shape[0]
    rows = np.sort(rng.choice(3 * m, m, replace=False)).astype(np.int32)
    x = rng.uniform(-1, 1, matrix.shape[1])
    base = rng.uniform(-1, 1, 3 * m)
    results = []
    for _ in range(2):
        y_dev = gpuarray.to_gpu(base)
        device.multiply(gpuarray.to_gpu(x), y_dev, rows=gpuarray.to_gpu(rows))
        device.stream.synchronize()
        results.append(y_dev.get())
    want = base.copy()
    want[rows] += matrix @ x
    np.testing.assert_allclose(results[0], want, rtol=1e-13, atol=1e-13)
    untouched = np.setdiff1d(np.arange(3 * m), rows)
    np.testing.assert_array_equal(results[0][untouched], base[untouched])
    np.testing.assert_array_equal(results[0], results[1])

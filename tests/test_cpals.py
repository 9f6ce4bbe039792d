"""CP-ALS: fits per iteration against a plain dense NumPy CP-ALS (Tensor Toolbox rules) written
here, on 3-, 4- and 5-order tensors, on 1/2/4 ranks, CPU and GPU, with checkpoint/resume.

Order: plan (unfoldings, row blocks) -> engines agree (each backend's engine against the dense
oracle on one rank's block) -> pipeline -> parallel -> failure behaviour -> GPU."""
import importlib
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from hisparse.context import VALUE_DTYPES, EngineContext
from hisparse.errors import HisparseError
from hisparse.formats import COOTensor
from hisparse.io import write_tensor
from hisparse.ops.cpals.cpu import numpy_mttkrp
from hisparse.ops.cpals.gpu import MAX_CHUNK, TEAM_OVERHEAD, team_chunk
from hisparse.ops.cpals.checkpoint import read_checkpoint, run_fingerprint, write_checkpoint
from hisparse.ops.cpals.layout import (ModeCSR, UnfoldingBlocks, block_from_part, coo_blocks,
                                       index_counts, mode_unfolding, partition_mode)
from hisparse.ops.cpals.products import FIT_SLOTS
from hisparse.ops.cpals.reference import coo_mttkrp, coo_rows

from conftest import run_hisparse
from helpers import gpu_bound, host_values as host, read_run, run_config, write_config

# Bro's amino-acid fluorescence tensor (5 x 201 x 61, dense), converted from GenTen's
# aminoacid_data.txt.gz with `hisparse convert` and shipped in inputs/.
AMINO_H5 = Path(__file__).resolve().parents[1] / "inputs" / "aminoacid.h5"


# -- the oracle: dense CP-ALS with the Tensor Toolbox rules, written plainly -------------------

def dense_mttkrp(dense, factors, n):
    """X_(n) times the Khatri-Rao product of the other factors, by einsum on the dense array."""
    order = dense.ndim
    operands = [dense, list(range(order))]
    for m in range(order):
        if m != n:
            operands += [factors[m], [m, order]]
    return np.einsum(*operands, [n, order])


def dense_model(lam, factors):
    order = len(factors)
    operands = [lam, [order]]
    for m, factor in enumerate(factors):
        operands += [factor, [m, order]]
    return np.einsum(*operands, list(range(order)))


def oracle_cp_als(dense, init, tol, max_iters):
    """Fits per iteration; the residual norm is taken on the dense model itself."""
    factors = [np.array(f, dtype=np.float64) for f in init]
    rank = factors[0].shape[1]
    norm_x = np.linalg.norm(dense)
    fits, fit = [], 0.0
    for iteration in range(max_iters):
        fit_old = fit
        for n in range(dense.ndim):
            gram_product = np.ones((rank, rank))
            for m in range(dense.ndim):
                if m != n:
                    gram_product *= factors[m].T @ factors[m]
            unew = np.linalg.solve(gram_product.T, dense_mttkrp(dense, factors, n).T).T
            if iteration == 0:
                lam = np.linalg.norm(unew, axis=0)
            else:
                lam = np.maximum(np.abs(unew).max(axis=0), 1.0)
            factors[n] = unew / lam
        fit = 1.0 - np.linalg.norm(dense - dense_model(lam, factors)) / norm_x
        fits.append(fit)
        if iteration > 0 and abs(fit - fit_old) < tol:
            break
    return np.array(fits), lam, factors


# -- problems ----------------------------------------------------------------------------------

def sparse_tensor(dims, nnz, seed, empty_slice=True):
    """Random sparse tensor with distinct coordinates; one index of mode 0 left empty."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(dims))
    linear = rng.choice(size, size=nnz, replace=False)
    coords = np.stack(np.unravel_index(linear, dims), axis=1).astype(np.int64)
    if empty_slice:
        coords = coords[coords[:, 0] != 1]
    values = rng.uniform(0.1, 1.0, size=len(coords))
    dense = np.zeros(dims)
    dense[tuple(coords.T)] = values
    return COOTensor(coords, values, tuple(dims)), dense


def write_problem(tmp_path, dims, nnz, rank, seed=0):
    tensor, dense = sparse_tensor(dims, nnz, seed)
    write_tensor(str(tmp_path / "x.h5"), tensor, mode="w")
    rng = np.random.default_rng(seed + 100)
    init = [rng.uniform(0.0, 1.0, size=(d, rank)) for d in dims]
    with h5py.File(tmp_path / "init.h5", "w") as handle:
        for m, factor in enumerate(init):
            handle.create_dataset(f"factor_{m}", data=factor)
    return dense, init


ONE_REPEAT = {"repeats": 1, "warmup": 0}


def config(tmp_path, params, out="out", **sections):
    """A cpals config on ``tmp_path/x.h5`` (one repeat, no warm-up), results in ``out``."""
    sections.setdefault("input", {"path": str(tmp_path / "x.h5")})
    return write_config(tmp_path, "cpals", params, name=f"{out}.yaml", out=out,
                        run=ONE_REPEAT, **sections)


def run_fits(tmp_path, params, nprocs=1, out="out", **sections):
    return run_config(tmp_path, config(tmp_path, params, out=out, **sections), nprocs, out=out)


def one_error_line(proc, *names):
    """The run failed with exactly one ``hisparse: error:`` line naming every one of ``names``,
    and no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("hisparse: error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for name in names:
        assert str(name) in errors[0], errors[0]
    return errors[0]


def params_for(tmp_path, rank, tol=1e-6, max_iters=60, **more):
    return dict({"rank": rank, "tol": tol, "max_iters": max_iters,
                 "init": str(tmp_path / "init.h5")}, **more)


PROBLEMS = {3: ([9, 11, 13], 300, 4), 4: ([6, 7, 8, 5], 400, 3), 5: ([5, 6, 4, 5, 4], 500, 3)}


# -- plan --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dims,nnz", [([9, 11, 13], 300), ([6, 7, 8, 5], 400)])
def test_reference_mttkrp_is_the_indicator_product_bit_for_bit(dims, nnz):
    """The verification's compiled MTTKRP (coo_rows + coo_mttkrp) adds each row's terms in the
    nonzeros' order, as the sparse indicator product it replaced did: the same bits, empty
    slices included, and the dense MTTKRP within rounding."""
    import scipy.sparse as sp
    tensor, dense = sparse_tensor(dims, nnz, seed=31)
    rng = np.random.default_rng(37)
    order = rng.permutation(tensor.nnz)  # the nonzeros in no particular order
    subs, values = tensor.indices[order], tensor.values[order]
    factors = [rng.standard_normal((d, 5)) for d in dims]
    for n in range(len(dims)):
        rows = values[:, None].copy()
        for m in range(len(dims)):
            if m != n:
                rows = rows * factors[m][subs[:, m]]
        indicator = sp.csr_matrix((np.ones(len(values)), (subs[:, n], np.arange(len(values)))),
                                  shape=(dims[n], len(values)))
        got = coo_mttkrp(coo_rows(values, subs, n, dims[n]), factors, n)
        np.testing.assert_array_equal(got, indicator @ rows)
        np.testing.assert_allclose(got, dense_mttkrp(dense, factors, n), rtol=1e-12, atol=1e-12)


def test_numpy_mttkrp_on_unfolding_blocks_matches_dense():
    tensor, dense = sparse_tensor([7, 5, 6, 4], 200, seed=4)
    rng = np.random.default_rng(1)
    factors = [rng.standard_normal((d, 3)) for d in dense.shape]
    for n in range(4):
        csr = mode_unfolding(tensor, n)
        expected = dense_mttkrp(dense, factors, n)
        np.testing.assert_allclose(numpy_mttkrp(csr, factors, 3, chunk=17), expected,
                                   rtol=1e-12, atol=1e-12)
        blocks = partition_mode(csr, 3, "nnz_balanced")
        stacked = np.concatenate([numpy_mttkrp(b, factors, 3) for b in blocks])
        np.testing.assert_allclose(stacked, expected, rtol=1e-12, atol=1e-12)
        assert [b.row_offset for b in blocks] == sorted(b.row_offset for b in blocks)


@pytest.mark.parametrize("nparts", [1, 2, 3])
@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_blocks"])
@pytest.mark.parametrize("order", [3, 4])
def test_coo_blocks_sort_into_the_numpy_row_blocks(nparts, strategy, order):
    """What rank 0 sends the GPU ranks (each rank's nonzeros of its block of every mode,
    unsorted, cut from the row counts alone) sorts into exactly the blocks that NumPy builds
    from the whole unfolding, rows, bounds and all; one rank gets the tensor itself."""
    dims = [9, 11, 13, 5][:order]
    tensor, _ = sparse_tensor(dims, 350, seed=order + nparts)
    shuffled = np.random.default_rng(1).permutation(tensor.nnz)  # any input order
    tensor = COOTensor(tensor.indices[shuffled], tensor.values[shuffled], tensor.shape)
    for n in range(order):
        expected = partition_mode(mode_unfolding(tensor, n, np.int32), nparts, strategy)
        blocks = coo_blocks(tensor, n, nparts, strategy, np.int32)
        assert len(blocks) == nparts
        if nparts == 1:
            assert blocks[0].indices is tensor.indices
        for block, want in zip(blocks, expected):
            assert (block.row_offset, block.n_rows, block.nnz) == \
                (want.row_offset, want.n_rows, want.nnz)
            rows = block.indices[:, n]
            assert np.all((rows >= want.row_offset) & (rows < want.row_offset + want.n_rows))
            part = block_from_part(block.as_part("mode_"), "mode_")
            got = part.to_csr()
            assert got.indptr.dtype == np.int32 and got.row_offset == want.row_offset
            np.testing.assert_array_equal(got.indptr, want.indptr)
            np.testing.assert_array_equal(got.values, want.values)
            np.testing.assert_array_equal(got.other_idx, want.other_idx)
            assert got.other_modes == want.other_modes


@pytest.mark.parametrize("pattern", ["fibers", "distinct", "one run", "one nonzero", "none"])
def test_index_counts_by_runs_equal_bincount(pattern):
    """A mode's nonzeros per index counted as the device counts them (runs of equal indices
    adding their lengths once where runs are long, one count per nonzero where they are short)
    equal NumPy's bincount, from a strided column as ``mode_counts`` passes it."""
    rng = np.random.default_rng(4)
    size = 50
    column = {"fibers": np.repeat(rng.integers(0, size, 400), rng.integers(1, 14, 400)),
              "distinct": rng.integers(0, size, 300), "one run": np.full(30, 7),
              "one nonzero": np.array([size - 1]), "none": np.zeros(0, dtype=np.int64)}[pattern]
    coordinates = np.stack([rng.integers(0, 3, len(column)), column], axis=1)
    got = index_counts(coordinates[:, 1], size)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, np.bincount(column, minlength=size))


@pytest.mark.parametrize("team", [4, 16, 32])
def test_team_chunk_fills_the_last_wave_of_teams(team):
    """The 'fast' kernel's chunk: a multiple of the team within [team, 256]. Under the wave
    estimate (waves x (chunk + overhead)) it is never slower than the old fixed 256 and within
    a team's worth per wave of full waves; on a 2-rank share of a 20M-nonzero tensor the last
    wave is nearly full (it was 8% full at 256: 3.08 waves)."""
    rng = np.random.default_rng(team)

    def waves(nnz, chunk, resident):
        return -(-(-(-nnz // chunk)) // resident)

    for nnz, resident in zip(rng.integers(1, 10 ** 8, size=300), rng.integers(64, 40000, 300)):
        nnz, resident = int(nnz), int(resident)
        chunk = team_chunk(nnz, team, resident=resident)
        assert chunk % team == 0 and team <= chunk <= MAX_CHUNK
        estimate = waves(nnz, chunk, resident) * (chunk + TEAM_OVERHEAD)
        fixed = max(team, MAX_CHUNK // team * team)
        assert estimate <= waves(nnz, fixed, resident) * (fixed + TEAM_OVERHEAD)
        fewest = -(-nnz // (resident * MAX_CHUNK))
        assert estimate <= nnz / resident + fewest * (team + TEAM_OVERHEAD)
    # 38 registers per thread on sm_90: 6 blocks of 256 threads per SM, 132 SMs, teams of 16.
    resident = 6 * 132 * 256 // 16
    chunk = team_chunk(10_000_000, 16, resident=resident)
    teams = -(-10_000_000 // chunk)
    assert waves(10_000_000, chunk, resident) == 4 and teams / (4 * resident) > 0.9
    # A requested chunk is kept (rounded down to the team), and without occupancy the old rule.
    assert team_chunk(10_000_000, 16, requested=100, resident=resident) == 96
    assert team_chunk(10_000_000, 16) == MAX_CHUNK


# -- engines agree -----------------------------------------------------------------------------

PRECISION = {dtype: name for name, dtype in VALUE_DTYPES.items()}


def make_engine(backend, variant, local, rank, dtype, chunk=None):
    """The engine ``ENGINES[variant]`` of ``hisparse.ops.cpals.<backend>`` on ``local``, uploaded
    (the GPU one on the device the caller bound)."""
    def load_kernels(name, defines=None, extra_options=()):
        from hisparse.gpu import load_module
        return load_module(name, defines=defines, extra_options=extra_options)

    ctx = EngineContext(config={"precision": PRECISION[np.dtype(dtype)], "index_width": "auto"},
                        backend=backend, timer=None, device=None, rank=0,
                        load_kernels=load_kernels, log=lambda message: None,
                        maybe_fail=lambda phase, iteration=None: None)
    engines = importlib.import_module(f"hisparse.ops.cpals.{backend}").ENGINES
    engine = engines[variant](ctx, local, {"rank": rank, "chunk": chunk, "mttkrp": variant})
    engine.upload()
    return engine


@pytest.fixture
def bound_device(request):
    """Bind GPU 0 for the ``gpu`` parameter of an engines-agree test (nothing on the CPU)."""
    if request.node.callspec.params.get("backend") != "gpu":
        yield None
        return
    with gpu_bound(0) as device:
        yield device


def fill(array, values):
    """Overwrite an engine's array in place, as an all-reduce would (device or host)."""
    values = np.ascontiguousarray(values, dtype=array.dtype)
    if hasattr(array, "gpudata"):
        array.set(values)
    else:
        array[:] = values


def own_products(update, mttkrp, rows):
    """The column products of ``rows``: U^T U, <U, M> and max |U| per column (0 for no rows)."""
    mine = update[rows]
    return (mine.T @ mine, float(np.sum(mine * mttkrp[rows])),
            np.max(np.abs(mine), axis=0, initial=0.0))


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("variant", ["seed", "fast"])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_engines_agree_with_dense_oracle_on_one_rank_block(bound_device, backend, variant, dtype,
                                                           rtol):
    """One ALS sweep of the engine on rank 0's block of 2 (of every mode), with the exchanges
    played by the test (the other rank's products and rows from the oracle), step by step
    against dense NumPy: MTTKRP rows, solved rows and their own-row column products (U^T U,
    <U, M>, max |U|), then from everyone's products lambda, the Gram and the scaled rows."""
    dims, rank = [9, 8, 7, 6], 5
    tensor, dense = sparse_tensor(dims, 600, seed=8)
    local = UnfoldingBlocks(tuple(dims), [partition_mode(mode_unfolding(tensor, n, np.int32), 2,
                                                         "nnz_balanced")[0]
                                          for n in range(len(dims))])
    rng = np.random.default_rng(3)
    factors = [rng.uniform(0.1, 1.0, size=(d, rank)).astype(dtype).astype(np.float64)
               for d in dims]
    engine = make_engine(backend, variant, local, rank, dtype, chunk=32)
    try:
        engine.load([f.astype(dtype) for f in factors])
        for n, csr in enumerate(local.modes):
            rows = slice(csr.row_offset, csr.row_offset + csr.n_rows)
            engine.mttkrp(n)
            mttkrp = dense_mttkrp(dense, factors, n)
            scale = np.abs(mttkrp).max()
            assert np.abs(engine.local_mttkrp(n) - mttkrp[rows]).max() <= 10 * rtol * scale
            gram_product = np.ones((rank, rank))
            for m in range(len(dims)):
                if m != n:
                    gram_product *= factors[m].T @ factors[m]
            vinv = np.linalg.pinv(gram_product)
            sums, maxima = engine.solve(n, vinv.astype(dtype))
            update = mttkrp @ vinv
            gram, inner, column_max = engine.products()
            want_gram, want_inner, want_max = own_products(update, mttkrp, rows)
            np.testing.assert_allclose(gram, want_gram, rtol=0,
                                       atol=10 * rtol * np.abs(want_gram).max())
            assert abs(inner - want_inner) <= 10 * rtol * abs(want_inner)
            np.testing.assert_allclose(column_max, want_max, rtol=10 * rtol)
            # The exchange: every rank's products, and the other rank's rows.
            whole = slice(0, dims[n])
            all_gram, all_inner, all_max = own_products(update, mttkrp, whole)
            fill(sums, np.concatenate([all_gram.ravel(), [all_inner]]))
            fill(maxima, all_max)
            full = engine.factor_buffer(n)
            assert full.shape == (dims[n], rank)
            np.testing.assert_allclose(full[rows], update[rows], rtol=0,
                                       atol=10 * rtol * np.abs(update).max())
            others = np.ones(dims[n], dtype=bool)
            others[rows] = False
            full[others] = update[others]  # what the other rank's block brings
            engine.factor_gathered(n)
            engine.normalize(n, first=False)
            lam = np.maximum(all_max, 1.0)
            factors[n] = update / lam
            got_lam, got_grams = engine.state()
            np.testing.assert_allclose(got_lam, lam, rtol=10 * rtol)
            np.testing.assert_allclose(got_grams[n], factors[n].T @ factors[n], rtol=0,
                                       atol=10 * rtol * np.abs(factors[n].T @ factors[n]).max())
        for got, expected in zip(engine.factors(), factors):
            np.testing.assert_allclose(got, expected, rtol=0,
                                       atol=10 * rtol * np.abs(expected).max())
    finally:
        engine.free()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_own_row_products_over_uneven_and_empty_blocks_give_the_whole_gram(bound_device,
                                                                          backend):
    """Five 'ranks' hold blocks of mode 0's rows of very different sizes: no rows at all, one
    row, one row without nonzeros, three rows, seven rows. Each engine's solve writes only its
    own rows and its column products cover only them; their sum (and maximum) is the Gram (and
    the column maxima) of the whole update, and from those (and the gathered rows) every engine
    computes the same lambda, Gram and scaled factor."""
    dims, rank, n = [12, 7, 9], 4, 0
    tensor, dense = sparse_tensor(dims, 300, seed=17)  # row 1 of mode 0 is empty
    full_csr = mode_unfolding(tensor, n, np.int32)
    bounds = [0, 0, 1, 2, 5, 12]
    blocks = [full_csr.row_block(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert [b.n_rows for b in blocks] == [0, 1, 1, 3, 7] and blocks[2].nnz == 0
    others = [mode_unfolding(tensor, m, np.int32) for m in range(1, 3)]
    rng = np.random.default_rng(5)
    factors = [rng.uniform(0.1, 1.0, size=(d, rank)) for d in dims]
    vinv = np.linalg.inv((factors[1].T @ factors[1]) * (factors[2].T @ factors[2]))
    mttkrp = dense_mttkrp(dense, factors, n)
    update = mttkrp @ vinv
    engines = [make_engine(backend, "fast", UnfoldingBlocks(tuple(dims), [block] + others),
                           rank, np.float64, chunk=32) for block in blocks]
    try:
        reduced = []
        for engine in engines:
            engine.load(factors)
            engine.mttkrp(n)
            reduced.append(engine.solve(n, vinv))  # views the all-reduce would fill
        sums = np.sum([host(r[0]) for r in reduced], axis=0)
        maxima = np.max([host(r[1]) for r in reduced], axis=0)
        all_gram, all_inner, all_max = own_products(update, mttkrp, slice(0, dims[n]))
        np.testing.assert_allclose(sums[:-1].reshape(rank, rank), all_gram, rtol=1e-12)
        assert sums[-1] == pytest.approx(all_inner, rel=1e-12)
        np.testing.assert_allclose(maxima, all_max, rtol=1e-12)
        assert not host(reduced[0][0]).any()  # no rows: nothing to add
        lam = np.sqrt(np.diag(all_gram))  # first iteration: column norms
        for engine, block, (own_sums, own_maxima) in zip(engines, blocks, reduced):
            fill(own_sums, sums)
            fill(own_maxima, maxima)
            rows = slice(block.row_offset, block.row_offset + block.n_rows)
            full = engine.factor_buffer(n)
            np.testing.assert_allclose(full[rows], update[rows], rtol=1e-12)
            others = np.ones(dims[n], dtype=bool)
            others[rows] = False
            np.testing.assert_array_equal(full[others], factors[n][others])  # not solved here
            full[others] = update[others]  # the all-gather
            engine.factor_gathered(n)
            engine.normalize(n, first=True)
            got_lam, got_grams = engine.state()
            np.testing.assert_allclose(got_lam, lam, rtol=1e-12)
            np.testing.assert_allclose(got_grams[n], all_gram / np.outer(lam, lam), rtol=1e-12)
            np.testing.assert_allclose(engine.factors()[n], update / lam, rtol=1e-12)
    finally:
        for engine in engines:
            engine.free()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rank,rows", [(3, 700), (5, 700), (16, 40000), (32, 9000), (70, 700)])
def test_solve_and_column_products_over_many_rows(bound_device, backend, rank, rows):
    """The solve's rows and column products on a mode of many rows, against NumPy. On the GPU
    (``solve_grid``'s blocks, shared-memory tiles of ``4096 // rank`` rows): rank 3 and 5 (odd:
    one product per register tile) fit a block's rows in one tile; rank 16 (2 x 2 register tiles
    in 8 row groups: two tiles a block) and 32 (V^-1 in shared memory, 16 row groups for the
    maxima: three tiles a block) add up several, and their last block adds the partials by
    warps; rank 70 (products beyond the register tiles, V^-1 read from global memory, the
    partials by one thread a column) three tiles of 58 rows."""
    dims = [rows, 9, 8]
    tensor, dense = sparse_tensor(dims, max(3000, 2 * rows), seed=23)
    local = UnfoldingBlocks(tuple(dims), [mode_unfolding(tensor, m, np.int32) for m in range(3)])
    rng = np.random.default_rng(29)
    factors = [rng.uniform(0.1, 1.0, size=(d, rank)) for d in dims]
    # Any invertible V^-1 serves: the test checks the solve and its products, not the ALS.
    vinv = np.eye(rank) + 0.01 * rng.standard_normal((rank, rank))
    mttkrp = dense_mttkrp(dense, factors, 0)
    update = mttkrp @ vinv
    engine = make_engine(backend, "fast", local, rank, np.float64, chunk=32)
    try:
        engine.load(factors)
        engine.mttkrp(0)
        sums, maxima = (host(part) for part in engine.solve(0, vinv))
        gram, inner, column_max = own_products(update, mttkrp, slice(0, dims[0]))
        np.testing.assert_allclose(sums[:-1].reshape(rank, rank), gram, rtol=1e-11)
        assert sums[-1] == pytest.approx(inner, rel=1e-11)
        np.testing.assert_allclose(maxima, column_max, rtol=1e-12)
        np.testing.assert_allclose(engine.factor_buffer(0), update, rtol=1e-11)
    finally:
        engine.free()


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("variant", ["seed", "fast"])
@pytest.mark.parametrize("dtype,atol", [(np.float64, 1e-9), (np.float32, 1e-5)])
def test_engine_als_steps_match_dense_oracle(bound_device, backend, variant, dtype, atol):
    """The engine's own ALS (one rank holding the whole tensor): its R x R solve from its Grams,
    normalisation and fit (on the GPU all on the device, the host reading one number per
    iteration) give the dense oracle's fits per iteration, lambda, Grams and factors."""
    dims, nnz, rank = PROBLEMS[4]
    tensor, dense = sparse_tensor(dims, nnz, seed=13)
    rng = np.random.default_rng(113)
    init = [rng.uniform(0.0, 1.0, size=(d, rank)).astype(dtype).astype(np.float64) for d in dims]
    iterations = 8
    expected, lam, factors = oracle_cp_als(dense, init, tol=0.0, max_iters=iterations)
    local = UnfoldingBlocks(tuple(dims), [mode_unfolding(tensor, n, np.int32)
                                          for n in range(len(dims))])
    engine = make_engine(backend, variant, local, rank, dtype, chunk=32)
    stream = getattr(engine, "stream", None)
    norm_x = float(np.linalg.norm(dense))
    try:
        engine.load([f.astype(dtype) for f in init])
        fits = []
        for iteration in range(iterations):
            for n in range(len(dims)):
                engine.mttkrp(n)
                engine.solve(n)  # one rank: its products are everyone's
                engine.normalize(n, first=iteration == 0,
                                 norm_x=norm_x if n == len(dims) - 1 else None)
            if stream is not None:
                stream.synchronize()
            fits.append(engine.read_fit())
        np.testing.assert_allclose(fits, expected, rtol=0, atol=atol)
        got_lam, got_grams = engine.state()
        np.testing.assert_allclose(got_lam, lam, rtol=10 * atol)
        for got_gram, got_factor, factor in zip(got_grams, engine.factors(), factors):
            np.testing.assert_allclose(got_gram, factor.T @ factor, rtol=0,
                                       atol=10 * atol * np.abs(factor.T @ factor).max())
            np.testing.assert_allclose(got_factor, factor, rtol=0,
                                       atol=10 * atol * np.abs(factor).max())
    finally:
        engine.free()


# -- pipeline ----------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [3, 4, 5])
def test_cpals_cpu_fits_match_dense_numpy(tmp_path, order):
    dims, nnz, rank = PROBLEMS[order]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=order)
    expected, lam, factors = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank), backend="cpu")
    assert run["attrs"]["verify_passed"]
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
    # The stored model (arranged: unit columns, sorted weights) reproduces the oracle's model.
    model = dense_model(arrays["lambda"], [arrays[f"factor_{m}"] for m in range(order)])
    np.testing.assert_allclose(model, dense_model(lam, factors), rtol=0,
                               atol=1e-8 * np.abs(dense).max())
    assert np.all(np.diff(arrays["lambda"]) <= 0)


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_blocks"])
def test_cpals_cpu_ranks_give_the_same_fits(tmp_path, nprocs, strategy):
    dims, nnz, rank = PROBLEMS[4]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=11)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank), nprocs=nprocs, backend="cpu",
                           partition={"strategy": strategy})
    assert run["attrs"]["nranks"] == nprocs
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
    # Every rank owns a block of every mode's rows; together they cover all nonzeros N times.
    assert int(np.sum(run["rank_vars"]["nnz"])) == 4 * int(np.count_nonzero(dense))


@pytest.mark.parametrize("nprocs", [2, 4])
def test_cpals_cpu_ranks_with_uneven_and_empty_blocks(tmp_path, nprocs):
    """Nonzeros crowded into two indices of mode 0: the nnz-balanced blocks are uneven and
    some ranks' blocks of mode 0 hold no nonzeros (their rows of U are zero and add nothing to
    the Gram); the fits still follow the dense oracle."""
    dims, rank = [8, 9, 10], 3
    rng = np.random.default_rng(23)
    # Mode 0: indices 0 and 1 only, so the blocks after the first one or two hold empty rows.
    coords = np.stack([rng.choice([0, 1], size=400, p=[0.45, 0.55]),
                       rng.integers(0, 9, size=400), rng.integers(0, 10, size=400)], axis=1)
    coords = np.unique(coords, axis=0)
    values = rng.uniform(0.1, 1.0, size=len(coords))
    tensor = COOTensor(coords.astype(np.int64), values, tuple(dims))
    blocks = partition_mode(mode_unfolding(tensor, 0, np.int32), nprocs, "nnz_balanced")
    assert min(b.nnz for b in blocks) == 0 and max(b.nnz for b in blocks) > tensor.nnz // 2
    write_tensor(str(tmp_path / "x.h5"), tensor, mode="w")
    dense = np.zeros(dims)
    dense[tuple(coords.T)] = values
    init = [rng.uniform(0.1, 1.0, size=(d, rank)) for d in dims]
    with h5py.File(tmp_path / "init.h5", "w") as handle:
        for m, factor in enumerate(init):
            handle.create_dataset(f"factor_{m}", data=factor)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=30)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, max_iters=30), nprocs=nprocs,
                           backend="cpu")
    assert run["attrs"]["verify_passed"]
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("nprocs", [1, 2])
def test_cpals_collect_parts_and_none(tmp_path, nprocs):
    """``output.collect: parts``: every rank writes its own rows of each factor (arranged like
    the gathered ones), rank 0 the fits and lambda; the results file joins them into what
    ``gather`` writes. ``none`` writes no arrays, and the fits are still verified."""
    from test_collect_modes import results_in_parts
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=91)
    params = params_for(tmp_path, rank, tol=1e-7)
    _, gathered = run_fits(tmp_path, params, nprocs=nprocs, out="gather", backend="cpu")
    cfg = config(tmp_path, params, out="parts", backend="cpu",
                 output={"dir": str(tmp_path / "parts"), "collect": "parts"})
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, joined = read_run(results_in_parts(tmp_path, "parts"))
    assert run["attrs"]["verify_enabled"] and run["attrs"]["verify_passed"]
    assert len(list((tmp_path / "parts").glob("*.part*.h5"))) == nprocs
    assert sorted(joined) == sorted(gathered)
    for name, array in gathered.items():
        if name != "iteration_seconds":
            np.testing.assert_allclose(joined[name], array, rtol=1e-12, atol=1e-15, err_msg=name)
    cfg = config(tmp_path, params, out="none", backend="cpu",
                 output={"dir": str(tmp_path / "none"), "collect": "none"})
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs, out="none")
    assert arrays == {} and run["attrs"]["verify_enabled"] and run["attrs"]["verify_passed"]
    assert run["attrs"]["final_fit"] == pytest.approx(gathered["fit"][-1], abs=1e-12)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("nprocs", [1, 2])
def test_cpals_fixed_iterations_read_the_fits_at_the_end(tmp_path, backend, nprocs):
    """tol = 0 (no convergence test): the iterations run back to back and their fits are read
    after one wait at the end; they are the oracle's, one per iteration, each timed."""
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=97)
    expected, _, _ = oracle_cp_als(dense, init, tol=0.0, max_iters=7)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, tol=0.0, max_iters=7),
                           nprocs=nprocs, backend=backend)
    assert run["attrs"]["verify_passed"] and run["attrs"]["iterations"] == 7
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
    seconds = arrays["iteration_seconds"]
    assert len(seconds) == 7 and np.all(seconds > 0)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_cpals_resume_after_kill_matches_uninterrupted(tmp_path, backend):
    """A run killed after iteration 7, resumed from its checkpoint of iteration 6, gives the
    fits and lambda of the uninterrupted run (on the GPU: the checkpoint is read from the
    state an iteration leaves, every mode normalised, whatever it deferred inside)."""
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=21)
    _, whole = run_fits(tmp_path, params_for(tmp_path, rank, tol=1e-7), out="whole",
                        backend=backend)
    assert len(whole["fit"]) > 8
    checkpoint = tmp_path / "ck.h5"
    params = params_for(tmp_path, rank, tol=1e-7, checkpoint_every=3, checkpoint=str(checkpoint))
    killed = config(tmp_path, params, out="killed", backend=backend,
                    debug={"fail_rank": 0, "fail_phase": "iteration", "fail_iteration": 7,
                           "fail_mode": "kill"})
    proc = run_hisparse(["run", killed, "--quiet"])
    assert proc.returncode != 0
    assert not list((tmp_path / "killed").glob("*.h5"))  # it really died before the end
    with h5py.File(checkpoint, "r") as handle:
        assert handle.attrs["iteration"] == 6
    # Resume through the CLI flag, as a user would after a crash.
    cfg = config(tmp_path, params, out="resumed", backend=backend)
    _, resumed = run_config(tmp_path, cfg, out="resumed", extra_args=["--resume"])
    assert len(resumed["fit"]) == len(whole["fit"])
    np.testing.assert_allclose(resumed["fit"], whole["fit"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(resumed["lambda"], whole["lambda"], rtol=1e-10)


def test_cpals_nvecs_init_uses_leading_singular_vectors(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    dense, _ = write_problem(tmp_path, dims, nnz, rank, seed=5)
    init = []
    for n in range(3):
        unfolding = np.moveaxis(dense, n, 0).reshape(dims[n], -1)
        left = np.linalg.svd(unfolding, full_matrices=False)[0][:, :rank]
        init.append(left)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=40)
    _, arrays = run_fits(tmp_path, params_for(tmp_path, rank, max_iters=40, init="nvecs"),
                         backend="cpu")
    # Column signs of the start do not change the fits (the models only flip signs).
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)


def test_cpals_checkpoint_needs_a_path(tmp_path):
    write_problem(tmp_path, [5, 6, 7], 50, 2)
    cfg = config(tmp_path, {"rank": 2, "checkpoint_every": 2}, backend="cpu")
    proc = run_config(tmp_path, cfg, expect_rc=2)
    assert proc.returncode != 0
    assert "operation.params.checkpoint" in proc.stderr


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_cpals_aminoacid_rank3_fit(tmp_path, backend):
    cfg = write_config(tmp_path, "cpals", {"rank": 3, "tol": 1.0e-6, "max_iters": 100},
                       name="amino.yaml", run={"name": "amino", "seed": 3, **ONE_REPEAT},
                       input={"path": str(AMINO_H5)}, backend=backend)
    run, _ = run_config(tmp_path, cfg)
    assert run["attrs"]["verify_passed"]
    assert run["attrs"]["final_fit"] > 0.9


# -- failure behaviour (issue 16) ---------------------------------------------------------------

def _fingerprint(tensor, rank=3, init="nvecs", precision="fp64"):
    return run_fingerprint(tensor.shape, mode_unfolding(tensor, 0, np.int32), rank, init,
                           precision)


def test_checkpoint_fingerprint_ignores_nonzero_order_and_sees_one_changed_value():
    tensor, _ = sparse_tensor([6, 5, 4], 60, seed=2)
    order = np.random.default_rng(0).permutation(tensor.nnz)
    shuffled = COOTensor(tensor.indices[order], tensor.values[order], tensor.shape)
    assert _fingerprint(shuffled) == _fingerprint(tensor)
    values = tensor.values.copy()
    values[7] = np.nextafter(values[7], 2.0)
    changed = _fingerprint(COOTensor(tensor.indices, values, tensor.shape))
    assert changed["data_hash"] != _fingerprint(tensor)["data_hash"]
    assert changed["shape"] == (6, 5, 4) and changed["nnz"] == tensor.nnz


@pytest.mark.parametrize("damage,words", [
    ("missing dataset", "dataset 'factor_1' not found"),
    ("wrong shape", "dataset 'gram_0' has shape (2, 3), expected (3, 3)"),
    ("not finite", "dataset 'lambda' does not hold finite numbers"),
    ("no fingerprint", "no fingerprint"),
    ("not HDF5", "cannot read checkpoint"),
])
def test_bad_checkpoint_contents_are_one_error_naming_the_file(tmp_path, damage, words):
    tensor, _ = sparse_tensor([6, 5, 4], 60, seed=2)
    fingerprint = _fingerprint(tensor)
    rng = np.random.default_rng(4)
    factors = [rng.uniform(size=(size, 3)) for size in tensor.shape]
    path = tmp_path / "ck.h5"
    write_checkpoint(str(path), {"factors": factors, "grams": [f.T @ f for f in factors],
                                 "lam": np.ones(3), "fits": [0.25, 0.5],
                                 "fingerprint": fingerprint})
    intact = read_checkpoint(str(path), fingerprint, np.float64)
    assert intact["fits"] == [0.25, 0.5]
    np.testing.assert_array_equal(intact["factors"][1], factors[1])
    with h5py.File(path, "a") as handle:
        if damage == "missing dataset":
            del handle["factor_1"]
        elif damage == "wrong shape":
            del handle["gram_0"]
            handle["gram_0"] = np.zeros((2, 3))
        elif damage == "not finite":
            handle["lambda"][0] = np.nan
        elif damage == "no fingerprint":
            del handle.attrs["data_hash"]
    if damage == "not HDF5":
        path.write_text("factor_0: not an HDF5 file\n")
    with pytest.raises(HisparseError) as raised:
        read_checkpoint(str(path), fingerprint, np.float64)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message


def test_cpals_resume_refuses_a_checkpoint_of_another_run(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=51)
    checkpoint = tmp_path / "ck.h5"
    params = params_for(tmp_path, rank, tol=0, max_iters=2, checkpoint_every=2,
                        checkpoint=str(checkpoint))
    run_fits(tmp_path, params, out="first", backend="cpu")
    params["max_iters"] = 4

    def resume(out, **changes):
        cfg = config(tmp_path, dict(params, **changes.pop("params", {})), out=out,
                     backend="cpu", **changes)
        return run_config(tmp_path, cfg, out=out, extra_args=["--resume"], expect_rc=2)

    one_error_line(resume("rank", params={"rank": rank + 1}), checkpoint,
                   f"rank {rank} in the checkpoint, {rank + 1} here")
    one_error_line(resume("fp32", precision="fp32"), checkpoint,
                   "precision fp64 in the checkpoint, fp32 here")
    # Another tensor of the same shape and nonzero pattern: only the data hash tells.
    tensor, _ = sparse_tensor(dims, nnz, seed=51)
    write_tensor(str(tmp_path / "x.h5"), COOTensor(tensor.indices, tensor.values * 1.5,
                                                   tensor.shape), mode="w")
    line = one_error_line(resume("other_tensor"), checkpoint, "tensor data hash")
    assert "rank" not in line and "shape" not in line
    checkpoint.write_text("not a checkpoint")  # refused by the output guard before the input
    one_error_line(resume("not_hdf5"), checkpoint, "not a checkpoint of hisparse")


def test_cpals_zero_nnz_tensor_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "x.h5"
    write_tensor(str(path), COOTensor(np.zeros((0, 3), dtype=np.int64), np.zeros(0), (4, 5, 6)),
                 mode="w")
    proc = run_config(tmp_path, config(tmp_path, {"rank": 2}, backend="cpu"), expect_rc=2)
    one_error_line(proc, path, "no nonzeros")


def test_cpals_rank_above_a_mode_length_warns_naming_the_mode(tmp_path):
    dense, init = write_problem(tmp_path, [3, 8, 9], 120, 4, seed=61)
    proc = run_hisparse(["run", config(tmp_path, params_for(tmp_path, 4, max_iters=5),
                                       backend="cpu"), "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr
    assert "mode 0" in warnings[0] and "rank 4" in warnings[0] and "length 3" in warnings[0]


def test_cpals_mode_shorter_than_the_ranks_is_named(tmp_path):
    write_problem(tmp_path, [4, 1, 5], 15, 2, seed=71)
    proc = run_config(tmp_path, config(tmp_path, params_for(tmp_path, 2), backend="cpu"),
                      nprocs=2, expect_rc=2)
    line = one_error_line(proc, "mode 1 (length 1)", "2 ranks", "at most 1 rank")
    assert "rows" not in line


# -- GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def gpu_context():
    from hisparse.gpu import bind_device
    device = bind_device(0)
    yield device
    device.release()


def _engine(tensor, rank, kernel, dtype, chunk=None):
    local = UnfoldingBlocks(tuple(tensor.shape), [mode_unfolding(tensor, n, np.int32)
                                                  for n in range(tensor.order)])
    return make_engine("gpu", kernel, local, rank, dtype, chunk=chunk)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["seed", "fast"])
@pytest.mark.parametrize("dims,rank", [([40, 3, 30], 16), ([9, 8, 7, 6], 5),
                                       ([7, 6, 5, 4, 6], 40)])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_gpu_mttkrp_kernels_match_dense(gpu_context, kernel, dims, rank, dtype, rtol):
    # Few rows in mode 1 (long rows that span many chunks) and an empty slice of mode 0.
    tensor, dense = sparse_tensor(dims, min(int(np.prod(dims)) // 2, 2000), seed=len(dims))
    rng = np.random.default_rng(2)
    factors = [rng.uniform(-1, 1, size=(d, rank)) for d in dims]
    engine = _engine(tensor, rank, kernel, dtype, chunk=32)
    try:
        engine.load([f.astype(dtype) for f in factors])
        for n in range(len(dims)):
            engine.mttkrp(n)
            expected = dense_mttkrp(dense, factors, n)
            got = engine.local_mttkrp(n)
            scale = np.abs(expected).max()
            assert np.abs(got - expected).max() <= rtol * scale * 10
    finally:
        engine.free()


def random_coo(dims, nnz, seed, crowded=False):
    """Distinct random coordinates in any order (no dense array: the shape may be huge);
    ``crowded`` puts every nonzero at index 0 of mode 0 (the other blocks of mode 0 empty)."""
    rng = np.random.default_rng(seed)
    coords = np.stack([rng.integers(0, d, size=nnz) for d in dims], axis=1).astype(np.int64)
    if crowded:
        coords[:, 0] = 0
    coords = np.unique(coords, axis=0)
    coords = coords[rng.permutation(len(coords))]
    return COOTensor(coords, rng.uniform(0.1, 1.0, size=len(coords)), tuple(dims))


@pytest.mark.gpu
@pytest.mark.parametrize("nparts", [1, 3])
@pytest.mark.parametrize("dims,crowded", [([40, 3, 30], False), ([9, 8, 7, 6], False),
                                          ([6, 5, 4], True),
                                          ([2 ** 21, 2 ** 21, 2 ** 21, 5], False)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gpu_sorts_each_rank_block_into_the_numpy_unfolding(gpu_context, nparts, dims, crowded,
                                                            dtype):
    """Each rank's nonzeros of its blocks, unsorted, sorted into CSR on the device equal the
    NumPy builder's blocks exactly (row pointers, values, coordinates): with the 64-bit key,
    with the lexsort where (row, other modes) overflows it (the 2^21-long modes), and for
    blocks without nonzeros (all of mode 0 at index 0)."""
    tensor = random_coo(dims, 400, seed=len(dims) + nparts, crowded=crowded)
    order = len(dims)
    blocks = [coo_blocks(tensor, n, nparts, "nnz_balanced", np.int32) for n in range(order)]
    expected = [partition_mode(mode_unfolding(tensor, n, np.int32), nparts, "nnz_balanced")
                for n in range(order)]
    if crowded and nparts > 1:  # one part holds every nonzero
        assert any(block.nnz == 0 for block in blocks[0])
    for r in range(nparts):
        local = UnfoldingBlocks(tuple(dims), [blocks[n][r] for n in range(order)])
        engine = make_engine("gpu", "fast", local, 2, dtype)
        try:
            assert engine.unfoldings_built_on == "device"
            for n in range(order):
                got, want = engine.local_unfolding(n), expected[n][r]
                assert (got.row_offset, got.n_rows) == (want.row_offset, want.n_rows)
                np.testing.assert_array_equal(got.indptr, want.indptr)
                np.testing.assert_array_equal(got.values, want.values.astype(dtype))
                np.testing.assert_array_equal(got.other_idx, want.other_idx)
        finally:
            engine.free()


@pytest.mark.gpu
@pytest.mark.parametrize("nparts", [2, 3])
@pytest.mark.parametrize("dims", [[40, 3, 30], [9, 8, 7, 6]])
def test_gpu_mttkrp_first_part_reads_only_the_rank_own_rows_of_the_previous_factor(
        gpu_context, nparts, dims):
    """The 'fast' engine parts each mode's nonzeros by the owner of their coordinate of the
    previous mode (mode 0's: the last mode, whose exchange the next iteration's first MTTKRP
    runs beside): its first part (what runs while the exchange brings the
    other ranks' rows) holds exactly the nonzeros of this rank's rows of that mode, and reads
    nothing else (the other rows of that factor are NaN here); both parts together give
    NumPy's MTTKRP of the block."""
    tensor = random_coo(dims, 500, seed=len(dims) + 10 * nparts)
    order, rank = len(dims), 5
    blocks = [coo_blocks(tensor, n, nparts, "nnz_balanced", np.int32) for n in range(order)]
    built = [partition_mode(mode_unfolding(tensor, n, np.int32), nparts, "nnz_balanced")
             for n in range(order)]
    rng = np.random.default_rng(4)
    factors = [rng.uniform(-1, 1, size=(d, rank)) for d in dims]
    parted = 0
    for r in range(nparts):
        engine = make_engine("gpu", "fast", UnfoldingBlocks(tuple(dims), [blocks[n][r] for n
                                                                         in range(order)]),
                             rank, np.float64, chunk=16)
        try:
            for n in range(order):
                before = (n - 1) % order
                block, previous = built[n][r], built[before][r]
                own = slice(previous.row_offset, previous.row_offset + previous.n_rows)
                coordinate = block.other_idx[block.other_modes.index(before)]
                early = (coordinate >= own.start) & (coordinate < own.stop)
                first_part = engine.parts[n][0]
                assert (first_part.nnz if first_part is not None else 0) == int(early.sum())
                parted += 0 < early.sum() < block.nnz
                hidden = [f.copy() for f in factors]
                outside = np.ones(dims[before], dtype=bool)
                outside[own] = False
                hidden[before][outside] = np.nan  # rows the exchange has not brought yet
                engine.load(hidden)
                engine.mttkrp_before_exchange(n)
                early_block = ModeCSR(n, block.n_rows, block.row_offset,
                                      _row_pointers(block, early), block.values[early],
                                      block.other_idx[:, early], block.other_modes)
                got = engine.local_mttkrp(n)
                np.testing.assert_allclose(got, numpy_mttkrp(early_block, factors, rank),
                                           rtol=1e-12, atol=1e-12)
                engine.load(factors)
                engine.mttkrp(n)
                np.testing.assert_allclose(engine.local_mttkrp(n),
                                           numpy_mttkrp(block, factors, rank),
                                           rtol=1e-12, atol=1e-12)
        finally:
            engine.free()
    assert parted  # some block had both parts


def _row_pointers(block, kept):
    """Row pointers of the nonzeros ``kept`` (a mask) of a CSR block."""
    rows = np.repeat(np.arange(block.n_rows), np.diff(block.indptr.astype(np.int64)))
    return np.concatenate([[0], np.cumsum(np.bincount(rows[kept], minlength=block.n_rows))])


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["seed", "fast"])
@pytest.mark.parametrize("dims", [[40, 3, 30], [9, 8, 7, 6], [30, 25]])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-11), (np.float32, 1e-4)])
@pytest.mark.parametrize("carry", ["none", "between", "all"])
def test_gpu_deferred_normalization_gives_the_plain_iterations(gpu_context, kernel, dims,
                                                               dtype, rtol, carry):
    """Three ALS iterations by the operation's sequence (every mode's exchange forked beside
    the next MTTKRP's first part, its normalisation deferred: the next MTTKRP reads the factor
    unnormalised and the next solve takes W = diag(1/lambda) V^-1) against the plain one
    (MTTKRP, solve, normalise) on another engine: the same fits, lambda, Grams and factors.
    ``carry``: whether an iteration's last mode is deferred too, into the next iteration's
    first MTTKRP, with its fit made on the side stream: in none, in the first two (as the
    operation runs ``max_iters`` 3), or in all three (an ALS that converged or was stopped
    after such an iteration: the factors read normalise the last one)."""
    tensor = random_coo(dims, 400, seed=len(dims) + 3)
    order, rank = len(dims), 4
    norm_x = float(np.linalg.norm(tensor.values))
    rng = np.random.default_rng(6)
    start = [rng.uniform(0.1, 1.0, size=(d, rank)).astype(dtype) for d in dims]
    plain = _engine(tensor, rank, kernel, dtype, chunk=32)
    deferred = _engine(tensor, rank, kernel, dtype, chunk=32)
    try:
        plain.load(start)
        deferred.load(start)
        carried = False
        for iteration in range(3):
            first = iteration == 0
            carries = carry == "all" or (carry == "between" and iteration < 2)
            for n in range(order):
                last = n == order - 1
                plain.mttkrp(n)
                plain.solve(n)
                plain.normalize(n, first=first, slot=iteration,
                                norm_x=norm_x if last else None)
                (deferred.mttkrp_after_exchange if n or carried else deferred.mttkrp)(n)
                deferred.solve(n)
                if last and not carries:
                    deferred.normalize(n, first=first, slot=iteration, norm_x=norm_x)
                    continue
                deferred.fork_exchange()
                deferred.mttkrp_before_exchange((n + 1) % order)
                deferred.exchange_done()  # one rank: nothing to move
                deferred.defer_normalize(n, first=first, **({"norm_x": norm_x, "slot": iteration}
                                                             if last else {}))
            if carries:
                deferred.join_side_streams()
            carried = carries
            plain.stream.synchronize()
            deferred.stream.synchronize()
            assert deferred.read_fit(iteration) == pytest.approx(plain.read_fit(iteration),
                                                                 rel=rtol, abs=rtol)
        lam, grams = plain.state()
        got_lam, got_grams = deferred.state()
        np.testing.assert_allclose(got_lam, lam, rtol=10 * rtol)
        for got, want in zip(got_grams + deferred.factors(), grams + plain.factors()):
            np.testing.assert_allclose(got, want, rtol=0, atol=10 * rtol * np.abs(want).max())
    finally:
        plain.free()
        deferred.free()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["seed", "fast"])
@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("order", [3, 5])
def test_cpals_gpu_fits_match_dense_numpy(tmp_path, kernel, nprocs, order):
    dims, nnz, rank = PROBLEMS[order]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=order + 30)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, mttkrp=kernel), nprocs=nprocs,
                           backend="gpu")
    assert run["attrs"]["backend"] == "gpu"
    assert run["attrs"]["mttkrp_kernel"] == ("mttkrp_row_block" if kernel == "seed"
                                             else "mttkrp_nnz_team")
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_cpals_gpu_fp32_and_cusparse_peer(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=41)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=20)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, max_iters=20), backend="gpu",
                           precision="fp32", peers=["cusparse"])
    assert run["attrs"]["verify_passed"]
    np.testing.assert_allclose(arrays["fit"][:5], expected[:5], rtol=0, atol=1e-4)
    peer = run["peers"]["cusparse"]
    if "skipped" not in peer:
        assert peer["max_rel_diff_vs_ours"] < 1e-4


@pytest.mark.gpu
def test_gpu_solve_names_the_mode_of_a_singular_system(gpu_context):
    """Equal columns give rank-1 Grams, so V is singular: the device solve flags it and the
    iteration's one read raises an error naming the mode (the CPU engine's pseudo-inverse
    carries on)."""
    tensor, _ = sparse_tensor([6, 5, 4], 60, seed=2)
    engine = _engine(tensor, 3, "fast", np.float64)
    try:
        engine.load([np.ones((size, 3)) for size in tensor.shape])
        engine.mttkrp(1)
        engine.solve(1)
        engine.normalize(1, first=False, norm_x=1.0)
        engine.stream.synchronize()
        with pytest.raises(HisparseError, match="system of mode 1 .* not positive definite"):
            engine.read_fit()
    finally:
        engine.free()


def _gpu_count():
    import pycuda.driver as cuda
    cuda.init()
    return cuda.Device.count()


def _cpals_in_process(config_path, comm, local_comm, backend, kind, prepare=None):
    """One repetition of CP-ALS in this process, as the driver runs it but on the transport
    ``kind`` chosen here (``prepare(op)`` called after the setup): ``(fits, device_exchange,
    result on rank 0 else None)``."""
    from hisparse.config import load_config
    from hisparse.context import RunContext
    from hisparse.layout import read_problem
    from hisparse.ops.cpals import CPALS
    from hisparse.parallel import make_transport
    from hisparse.timing import PhaseTimer
    config = load_config(str(config_path))
    device = None
    if backend == "gpu":
        from hisparse.gpu import bind_device
        device = bind_device(local_comm.rank)
    transport = make_transport(comm, kind, timeout=60)
    ctx = RunContext(config=config, comm=comm, local_comm=local_comm, backend=backend,
                     timer=PhaseTimer(CPALS.phases()), device=device, transport=transport)
    op = CPALS(ctx)
    try:
        op.setup(read_problem(config, CPALS) if comm.rank == 0 else None)
        if prepare is not None:
            prepare(op)
        op.run_once()
        op.collect()
        return op.fits, op.device_exchange, op.result() if comm.rank == 0 else None
    finally:
        op.teardown()
        transport.close()
        if device is not None:
            device.release()


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[1, 2])
@pytest.mark.parametrize("kind", ["nccl", "mpi"])
def test_cpals_gpu_transports_reproduce_cpu_fits(tmp_path, nprocs, kind):
    """The GPU engine on an NCCL transport (factor rows gathered GPU to GPU, <X, M> summed on
    the device) or on MPI (through pinned host memory) reproduces the CPU engine's fits, the
    dense oracle's, and the CPU run's model."""
    from mpi4py import MPI
    from hisparse.parallel import get_world, node_local
    comm = get_world()
    local_comm = node_local(comm)
    if kind == "nccl" and _gpu_count() < local_comm.size:
        pytest.skip("NCCL needs one GPU per rank")
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=81)  # each rank its own copy
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    cfg = config(tmp_path, params_for(tmp_path, rank))
    cpu_fits, _, cpu_result = _cpals_in_process(cfg, comm, local_comm, "cpu", "mpi")
    gpu_fits, device_exchange, gpu_result = _cpals_in_process(cfg, comm, local_comm, "gpu",
                                                              kind)
    ok = len(gpu_fits) == len(cpu_fits) == len(expected) and \
        np.allclose(gpu_fits, cpu_fits, rtol=0, atol=1e-10) and \
        np.allclose(gpu_fits, expected, rtol=0, atol=1e-9) and \
        device_exchange == (kind == "nccl")
    if comm.rank == 0:
        models = [dense_model(result["lambda"], result["factors"])
                  for result in (cpu_result, gpu_result)]
        ok = ok and np.allclose(models[1], models[0], rtol=0, atol=1e-8 * np.abs(dense).max())
    assert comm.allreduce(bool(ok), op=MPI.LAND)


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("tol,max_iters", [(0.0, 70), (1e-6, 60)])
def test_cpals_gpu_graphs_replay_the_launched_iterations(tmp_path, nprocs, tol, max_iters):
    """Iterations replayed as CUDA graphs (``gpu.graphs``, the default; at 2 ranks with the
    NCCL exchange inside them) give the fits and the model of iterations launched step by step,
    and the oracle's fits: with ``tol: 0`` past the 64 fit slots (one graph per slot, the first
    iteration's its own) and with the fit read after every iteration. The results say which ran
    and time a replay as the phase ``iteration``."""
    if _gpu_count() < nprocs:
        pytest.skip("NCCL needs one GPU per rank")
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=57)
    expected, _, _ = oracle_cp_als(dense, init, tol=tol, max_iters=max_iters)
    runs = {}
    for graphs in (True, False):
        runs[graphs] = run_fits(tmp_path, params_for(tmp_path, rank, tol=tol,
                                                     max_iters=max_iters),
                                nprocs=nprocs, out=f"graphs_{graphs}", backend="gpu",
                                gpu={"graphs": graphs})
    for graphs, (run, arrays) in runs.items():
        attrs, phases = run["attrs"], list(run["phases"])
        assert attrs["verify_passed"] and bool(attrs["cpals_graphs"]) == graphs
        assert attrs["factor_exchange"] == ("device" if nprocs > 1 else "none")
        assert len(arrays["fit"]) == len(expected)
        np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
        nodes = np.asarray(run["rank_vars"]["graph_nodes"])
        raised = np.asarray(run["rank_vars"]["graph_raised_nodes"])
        if graphs:  # per mode at least the MTTKRP, the solve and the normalisation
            assert np.all(nodes >= 3 * len(dims)), nodes
            # every kernel but the MTTKRPs: the solves, normalisations and inversions at least
            assert np.all(raised >= 3 * len(dims)) and np.all(raised < nodes), (raised, nodes)
        else:
            assert np.all(nodes == 0) and np.all(raised == 0), (nodes, raised)
        replayed = run["gpu"][:, :, phases.index("iteration")]
        launched = run["gpu"][:, :, phases.index("mttkrp")]
        assert np.all(np.isfinite(replayed if graphs else launched))
        assert np.all(np.isnan(launched if graphs else replayed))
    for name, array in runs[False][1].items():
        if name != "iteration_seconds":
            np.testing.assert_allclose(runs[True][1][name], array, rtol=0,
                                       atol=1e-12 * max(1.0, np.abs(array).max()), err_msg=name)


@pytest.mark.gpu
def test_cpals_gpu_failed_recording_launches_the_iterations(tmp_path, monkeypatch, capsys):
    """An iteration that cannot be recorded (here a host wait inside its solve) is launched
    directly, and so is every later one, with one line saying so; the fits are the oracle's."""
    from hisparse.ops.cpals.gpu import MttkrpGpuEngine
    from hisparse.parallel import get_world, node_local
    solve = MttkrpGpuEngine.solve

    def waiting_solve(self, n, vinv=None):
        self.stream.synchronize()  # not allowed while the stream records a graph
        return solve(self, n, vinv)

    monkeypatch.setattr(MttkrpGpuEngine, "solve", waiting_solve)
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=59)
    expected, _, _ = oracle_cp_als(dense, init, tol=0.0, max_iters=6)
    cfg = config(tmp_path, params_for(tmp_path, rank, tol=0.0, max_iters=6))
    comm = get_world()
    fits, _, _ = _cpals_in_process(cfg, comm, node_local(comm), "gpu", "mpi")
    np.testing.assert_allclose(fits, expected, rtol=0, atol=1e-9)
    lines = [line for line in capsys.readouterr().err.splitlines()
             if "CUDA graph recording failed" in line]
    assert len(lines) == 1 and "launching the iterations directly" in lines[0], lines


class _RecordedClosures:
    """Stands in for the GraphCache of recorded iterations where no GPU is: recording keeps
    the closure that would be recorded, a replay runs it, so that a replayed iteration runs
    the arguments frozen when its key was first recorded, as a CUDA graph does. ``fail``: every
    recording is refused."""

    def __init__(self, timer, fail):
        self.timer, self.fail = timer, fail
        self.graphs, self.keys, self.timer_on, self.error = {}, [], [], ""
        self.recorded = 0

    def graph(self, key, stream, issue, what):
        self.keys.append(key)
        self.timer_on.append(self.timer.enabled)
        if self.fail:
            self.error = "refused"
            return None
        if key not in self.graphs:
            self.graphs[key] = SimpleNamespace(launch=issue, nodes=7, raised=4)
            self.recorded += 1
        return self.graphs[key]

    def free(self):
        self.graphs = {}


@pytest.mark.parametrize("fail", [False, True])
def test_recorded_iterations_are_keyed_by_all_their_frozen_arguments(tmp_path, capsys, fail):
    """The recorded iterations' keys (first iteration, fit slot, whether the iteration takes or
    leaves a last mode's exchange) cover every argument frozen in them: with each key's first
    recording replayed for its later iterations, 70 iterations (past the 64 fit slots) give the
    launched iterations' fits bit for bit, and every replay restores the engine's bookkeeping
    that its key's recording ended with. Recording happens with the phase timer off; a recorded
    iteration forks mode 0's V^-1 first and its last mode prepares none. A refused recording is
    said once, the bookkeeping put back as it was before it, and every iteration is launched
    from then on.
    (The CPU engine, given the GPU engine's side-stream steps as no-ops, stands in for it.)"""
    from hisparse.parallel import get_world, node_local
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=61)
    cfg = config(tmp_path, params_for(tmp_path, rank, tol=0.0, max_iters=70))
    comm = get_world()
    launched, _, _ = _cpals_in_process(cfg, comm, node_local(comm), "cpu", "mpi")
    steps, caches, restored = [], [], []

    def prepare(op):
        engine, normalize = op.engine, op.engine.normalize

        def normalize_step(n, first, norm_x=None, slot=0, invert_next=True):
            steps.append(("normalize", n, invert_next))
            return normalize(n, first, norm_x=norm_x, slot=slot)

        engine.normalize, engine.fit_slots = normalize_step, FIT_SLOTS
        engine.invert_ahead = lambda mode: steps.append(("invert_ahead", mode))
        engine.join_inversion = lambda: None
        # the engine's bookkeeping: a counter of the recordings' ends stands in for it
        engine.bookkeeping = lambda: {"recorded": len(steps)}
        engine.restore_bookkeeping = restored.append
        caches.append(_RecordedClosures(op.ctx.timer, fail))
        op.graphs = caches[0]

    replayed, _, _ = _cpals_in_process(cfg, comm, node_local(comm), "cpu", "mpi", prepare)
    np.testing.assert_array_equal(replayed, launched)
    cache, lines = caches[0], [line for line in capsys.readouterr().err.splitlines()
                               if "CUDA graph recording failed" in line]
    assert not any(cache.timer_on)
    if fail:  # the bookkeeping from before the failed recording put back, then launched
        assert cache.keys == [(True, 0, False, False)] and len(lines) == 1
        assert restored == [{"recorded": 0}]
        assert ("invert_ahead", 0) not in steps
        return
    # (the CPU engine defers no normalisation: no iteration carries its last mode)
    assert cache.keys == [(i == 0, i % FIT_SLOTS, False, False) for i in range(70)]
    assert cache.recorded == FIT_SLOTS + 1 and not lines
    per_iteration = [("invert_ahead", 0)] + [("normalize", n, n < 2) for n in range(3)]
    assert steps == per_iteration * 70
    # every iteration restores the bookkeeping its key's recording ended with (the stand-in
    # records without running its closure: the steps counted are those before it)
    ends = {key: {"recorded": 4 * i} for i, key in enumerate(cache.keys[:FIT_SLOTS + 1])}
    assert restored == [ends[key] for key in cache.keys]


def test_an_iteration_carries_its_last_mode_unless_the_factors_are_read_after_it():
    """GPU engines (``DEFERS_NORMALIZATION``) leave an iteration's last mode to the next
    iteration's first MTTKRP, except after the run's last iteration and an iteration a
    checkpoint follows (both read the factors normalised); the CPU engine never does."""
    from hisparse.ops.cpals import CPALS
    op = CPALS.__new__(CPALS)  # the decision reads only the parameters and the engine
    op.engine = SimpleNamespace(DEFERS_NORMALIZATION=True)
    op.params = {"max_iters": 7, "checkpoint_every": 3}
    assert [op._carries(i) for i in range(7)] == [True, True, False, True, True, False, False]
    op.params = {"max_iters": 7, "checkpoint_every": 0}
    assert [op._carries(i) for i in range(7)] == [True] * 6 + [False]
    op.engine = SimpleNamespace(DEFERS_NORMALIZATION=False)  # as the CPU engine declares
    assert not any(op._carries(i) for i in range(7))

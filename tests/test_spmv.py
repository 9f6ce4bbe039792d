"""SpMV (CSR): the plan, the engines against each other on the same local data (CPU vs GPU), and
whole runs against SciPy on one and several ranks, CPU and GPU."""

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.formats import CSRMatrix
from hisparse.io import write_matrix
from hisparse.ops.spmv import SpmvLocal, threads_per_row
from hisparse.distmatrix import ghost_columns, local_positions, split_blocks

from helpers import (engine_for, gpu_bound, host_values as to_host, run_config, run_context,
                     write_config)

BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


def irregular_matrix(seed=3):
    """Rows of very different lengths, empty rows at the start, the end and in runs."""
    rng = np.random.default_rng(seed)
    m, n = 700, 500
    lengths = rng.integers(0, 12, size=m)
    lengths[:5] = 0
    lengths[-7:] = 0
    lengths[300:340] = 0
    lengths[100] = 480  # one long row
    rows = np.repeat(np.arange(m), lengths)
    cols = np.concatenate([rng.choice(n, size=k, replace=False) for k in lengths])
    return sp.csr_matrix((rng.standard_normal(len(rows)), (rows, cols)), shape=(m, n))


def _write_irregular(path):
    matrix = irregular_matrix()
    write_matrix(path, CSRMatrix.from_scipy(matrix))
    return matrix


def run_x(n):
    """The x of a run with ``x: random`` and the default seed."""
    return np.random.default_rng(0).uniform(-1, 1, n)


def assert_close_to_product(y, matrix, x, rtol):
    """max |y - A x| <= rtol * max (|A| |x|), the reference in float64."""
    reference = matrix.astype(np.float64) @ x.astype(np.float64)
    scale = abs(matrix).astype(np.float64) @ np.abs(x.astype(np.float64))
    bound = rtol * max(float(scale.max()) if len(scale) else 0.0, 1e-300)
    assert y.shape == reference.shape
    assert np.max(np.abs(y.astype(np.float64) - reference), initial=0.0) <= bound


# -- plan -----------------------------------------------------------------------------------------

def test_threads_per_row_follows_mean_row_length():
    assert threads_per_row(0.5) == 1
    assert threads_per_row(5) == 4
    assert threads_per_row(27) == 32
    assert threads_per_row(1000) == 32


# -- engines agree: the engine picked for a backend against the CPU engine and SciPy --------------

@pytest.fixture(scope="module")
def gpu_device():
    with gpu_bound(0) as device:
        yield device


def write_into(array, values):
    """Overwrite the first ``len(values)`` entries of an engine's vector (NumPy or GPUArray)."""
    values = np.ascontiguousarray(values, dtype=array.dtype)
    if not len(values):
        return
    if hasattr(array, "set"):
        array[:len(values)].set(values)
    else:
        array[:len(values)] = values


def make_engines(tmp_path, request, backend, locals_, **params):
    """The engine SpMV picks for ``backend`` and ``params`` on each of ``locals_``, uploaded and
    (CSR5) converted, on one rank without MPI."""
    device = request.getfixturevalue("gpu_device") if backend == "gpu" else None
    ctx = run_context(tmp_path, "spmv", params, backend, device,
                      input={"generate": {"kind": "poisson", "dims": [4, 4]}})
    engines = []
    for local in locals_:
        engine = engine_for(ctx, local, ctx.config["operation.params"]["format"])
        engines.append(engine)
        engine.upload()
        if hasattr(engine, "convert"):
            engine.convert()
    return engines


def simulate_ranks(engines, owned, ghosts, n_global, iterations):
    """Run the engines of simulated ranks in one process in the order SpMV.run_once composes
    them, with this test's own exchange (x assembled on the host from every engine's x) and sum
    over the ranks; returns every engine's y."""
    chained = engines[0].local.chained
    dtype = engines[0].local.x.dtype
    for engine in engines:
        engine.start()
    for index in range(iterations):
        if index and chained:  # the all-reduce that travels with the exchange
            total = sum(float(to_host(engine.norm2)[0]) for engine in engines)
            for engine in engines:
                write_into(engine.norm2, [total])
        x = np.zeros(n_global, dtype)
        for engine, mine in zip(engines, owned):
            x[mine] = to_host(engine.x)[:len(mine)]
        for engine, wanted in zip(engines, ghosts):
            engine.begin_exchange()
            write_into(engine.x_ghost, x[wanted])
            engine.end_exchange()
        for engine in engines:
            engine.multiply_local()
            engine.add_ghost()
            if chained:
                engine.next_x(index > 0)
    return [engine.result() for engine in engines]


def engine_result(tmp_path, request, backend, local, iterations=2, **params):
    """``(y, memory stats)`` of the engine SpMV picks for ``backend`` and ``params`` on
    ``local`` (one rank, no ghosts): upload, convert when the format has one, ``iterations``
    products."""
    engine, = make_engines(tmp_path, request, backend, [local], **params)
    try:
        y, = simulate_ranks([engine], [np.arange(len(local.x))], [np.zeros(0, np.int64)],
                            len(local.x), iterations)
    finally:
        engine.free()
    return y, engine.memory_stats()


def check_engines_agree(tmp_path, request, backend, local, rtol, **params):
    """The ``backend`` engine's y against SciPy in float64 and against the CPU engine's y on the
    same local data; returns the engine's memory stats."""
    y, stats = engine_result(tmp_path, request, backend, local, **params)
    cpu, _ = engine_result(tmp_path, request, "cpu", local, **params)
    matrix = local.matrix.to_scipy()
    assert y.dtype == local.matrix.data.dtype
    assert_close_to_product(y, matrix, local.x, rtol)
    assert_close_to_product(cpu, matrix, local.x, rtol)
    scale = abs(matrix).astype(np.float64) @ np.abs(local.x.astype(np.float64))
    assert np.max(np.abs(y.astype(np.float64) - cpu), initial=0.0) <= \
        2 * rtol * max(float(scale.max()) if len(scale) else 0.0, 1e-300)
    return stats


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("params", [{"format": "csr"}, {"format": "csr", "threads_per_row": 1},
                                    {"format": "csr", "threads_per_row": 32},
                                    {"format": "csr5", "sigma": 4},
                                    {"format": "csr5", "sigma": 32}],
                         ids=["csr", "csr-tpr1", "csr-tpr32", "csr5-sigma4", "csr5-sigma32"])
@pytest.mark.parametrize("index_dtype,value_dtype,rtol", [(np.int32, np.float64, 1e-13),
                                                          (np.int64, np.float32, 2e-5)],
                         ids=["int32-fp64", "int64-fp32"])
def test_engines_agree(tmp_path, request, backend, params, index_dtype, value_dtype, rtol):
    # A rank's block: the long row, a run of empty rows, rows past it.
    block = CSRMatrix.from_scipy(irregular_matrix()[60:520]).astype(value_dtype, index_dtype)
    x = run_x(block.ncols).astype(value_dtype)
    stats = check_engines_agree(tmp_path, request, backend,
                                SpmvLocal(block, x, sigma=params.get("sigma")), rtol, **params)
    if backend == "gpu":  # the arena saw at least the resident block
        assert stats["peak_device_bytes"] >= block.data.nbytes + block.indices.nbytes
    else:
        assert stats["peak_device_bytes"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("params", [{"format": "csr"}, {"format": "csr", "threads_per_row": 1},
                                    {"format": "csr5", "sigma": 4}],
                         ids=["csr", "csr-tpr1", "csr5-sigma4"])
@pytest.mark.parametrize("value_dtype,rtol", [(np.float64, 1e-13), (np.float32, 2e-5)],
                         ids=["fp64", "fp32"])
def test_engines_agree_with_uniform_values(tmp_path, request, backend, params, value_dtype,
                                           rtol):
    """A block whose every value is 0.75, handed over as its one value (``SpmvLocal.uniform``):
    each engine's y is SciPy's (the GPU keeps the value once, the CPU multiplies the array)."""
    block = CSRMatrix.from_scipy(irregular_matrix()[60:520]).astype(value_dtype, np.int32)
    block.data[:] = 0.75
    x = run_x(block.ncols).astype(value_dtype)
    local = SpmvLocal(block, x, sigma=params.get("sigma"),
                      uniform=np.array([0.75], dtype=value_dtype))
    check_engines_agree(tmp_path, request, backend, local, rtol, **params)


def power_chain(matrix, x, iterations):
    """This test's own chain: y = A x, then x = y / ||y|| before each further product."""
    y = matrix @ x
    for _ in range(iterations - 1):
        y = matrix @ (y / np.linalg.norm(y))
    return y


def simulated_split(matrix, x, owners, seed, **local_params):
    """Each simulated rank's SpmvLocal (ghosts in a shuffled receive order, a random send index)
    and its ghost columns, for the row owners ``owners`` (square matrix: x as the rows)."""
    rng = np.random.default_rng(seed)
    csr = CSRMatrix.from_scipy(matrix)
    owned = [np.flatnonzero(owners == rank) for rank in range(owners.max() + 1)]
    locals_, ghosts = [], []
    for mine in owned:
        position = local_positions(mine, matrix.shape[1])
        block = csr.rows(mine)
        wanted = rng.permutation(ghost_columns(block, position))
        local, ghost, ghost_rows = split_blocks(block, position, len(mine), wanted)
        send_index = np.sort(rng.choice(len(mine), size=len(mine) // 3, replace=False))
        locals_.append(SpmvLocal(local, x[mine], ghost, ghost_rows, send_index,
                                 chained=True, **local_params))
        ghosts.append(wanted)
    return locals_, owned, ghosts


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("params", [{"format": "csr"}, {"format": "csr5", "sigma": 4}],
                         ids=["csr", "csr5"])
@pytest.mark.parametrize("uniform", [False, True], ids=["values", "uniform"])
def test_engines_chain_over_simulated_ranks(tmp_path, request, backend, params, uniform):
    """Three simulated ranks with random (non-contiguous) rows: each engine's local and ghost
    blocks, packing, sum of squares and scaling give the power chain of the whole matrix.
    ``uniform``: every value is 0.5, handed over once (``SpmvLocal.uniform``); the GPU engines
    then must not read the blocks' values arrays, which are poisoned with NaN for them."""
    rng = np.random.default_rng(7)
    keep = np.ones(300)
    keep[40:60] = 0  # empty rows
    matrix = sp.csr_matrix(sp.diags(keep) @ (sp.random(300, 300, density=0.03, random_state=8)
                                             + sp.eye(300)))
    matrix.eliminate_zeros()
    if uniform:
        matrix.data[:] = 0.5
    x = rng.uniform(-1, 1, 300)
    owners = rng.integers(0, 3, 300)
    locals_, owned, ghosts = simulated_split(
        matrix, x, owners, seed=9, sigma=params.get("sigma"), ghost_threads_per_row=2,
        uniform=np.array([0.5]) if uniform else None)
    assert all(local.ghost.ncols for local in locals_)
    if uniform and backend == "gpu":
        for local in locals_:
            local.matrix.data[:] = np.nan
            local.ghost.data[:] = np.nan
    engines = make_engines(tmp_path, request, backend, locals_, **params)
    try:
        for engine, local in zip(engines, locals_):
            engine.start()
            # The engine's order, as the run issues it: the packing (communication stream)
            # waits for x's reset (compute stream); without it the test races on the GPU.
            engine.begin_exchange()
            packed = to_host(engine.pack())[:len(local.send_index)]
            np.testing.assert_array_equal(packed, local.x[local.send_index])
        ys = simulate_ranks(engines, owned, ghosts, 300, iterations=4)
    finally:
        for engine in engines:
            engine.free()
    y = np.zeros(300)
    for mine, part in zip(owned, ys):
        y[mine] = part
    reference = power_chain(matrix, x, 4)
    assert np.max(np.abs(y - reference)) <= 1e-13 * np.max(np.abs(reference))


# -- whole runs -----------------------------------------------------------------------------------

@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_modulo", "row_blocks"])
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_spmv_cpu_matches_scipy(tmp_path, strategy, nprocs):
    input_path = tmp_path / "a.h5"
    matrix = _write_irregular(input_path)
    cfg = write_config(tmp_path, "spmv", {"x": "random"}, input={"path": str(input_path)},
                       backend="cpu", partition={"strategy": strategy})
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["verify_passed"]
    assert run["attrs"]["nranks"] == nprocs
    np.testing.assert_allclose(arrays["y"], matrix @ run_x(matrix.shape[1]), rtol=1e-12,
                               atol=1e-12)
    # Every rank recorded its own rows, and the parts cover the matrix.
    assert int(np.sum(run["rank_vars"]["n_rows"])) == matrix.shape[0]
    assert int(np.sum(run["rank_vars"]["nnz"])) == matrix.nnz


@pytest.mark.gpu
@pytest.mark.parametrize("precision,rtol", [("fp64", 1e-12), ("fp32", 1e-5)])
@pytest.mark.parametrize("index_width", ["int32", "int64"])
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_spmv_gpu_matches_scipy(tmp_path, precision, rtol, index_width, nprocs):
    input_path = tmp_path / "a.h5"
    matrix = _write_irregular(input_path)
    cfg = write_config(tmp_path, "spmv", {"x": "random"}, input={"path": str(input_path)},
                       backend="gpu", precision=precision, index_width=index_width)
    run, arrays = run_config(tmp_path, cfg, nprocs=nprocs)
    assert run["attrs"]["backend"] == "gpu"
    x = run_x(matrix.shape[1])
    if precision == "fp32":
        x = x.astype(np.float32).astype(np.float64)
        reference = matrix.astype(np.float32).astype(np.float64) @ x
    else:
        reference = matrix @ x
    y = arrays["y"]
    assert np.max(np.abs(y - reference)) <= rtol * np.max(np.abs(reference))
    # GPU phases were timed with CUDA events.
    kernel = run["phases"].index("kernel")
    assert np.all(np.isfinite(run["gpu"][:, :, kernel]))


@pytest.mark.gpu
def test_spmv_gpu_poisson_bitwise_repeatable(tmp_path):
    input_path = tmp_path / "p.h5"
    write_matrix(input_path, generators.poisson([40, 40, 40], stencil=27))
    ys = []
    for out in ("out1", "out2"):
        cfg = write_config(tmp_path, "spmv", {"x": "random"}, name=f"{out}.yaml", out=out,
                           input={"path": str(input_path)}, backend="gpu")
        ys.append(run_config(tmp_path, cfg, out=out)[1]["y"])
    assert np.array_equal(ys[0], ys[1])

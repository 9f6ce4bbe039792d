"""SpTV (Y = X x_n v): fiber format, N-1-dimensional partition, chunk plan, the engines of each
backend on one rank's block, and end-to-end runs on one and several ranks, CPU and GPU, against
a plain NumPy reference written here."""
import numpy as np
import pytest

from hisparse.formats import COOTensor
from hisparse.formats._fiber import FiberTensor, fibers_by_sort
from hisparse.io import write_tensor
from hisparse.ops.sptv import SpTV
from hisparse.ops.sptv.op import YChecks, sample_runs
from hisparse.ops.sptv.plan import (LONG_FIBER, SEGMENT_NNZ, RankBlock, build_plan, chunk_bounds,
                                    fit_plan, parse_bytes)
from hisparse.partition._tensor import grid_shapes, partition_tensor

from helpers import (ARRAY_MODULES, array_module_named, bind_gpu, engine_for, read_run, run_config,
                     run_context, write_config)

#: The backends whose engines are compared on the same local data (GPU on the device only).
ENGINE_BACKENDS = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


# -- inputs and the reference -------------------------------------------------------------------

def _special_tensor(order, seed=0):
    """An order-``order`` tensor with empty slices, empty fibers, many single-nonzero fibers and,
    along every mode, one fiber longer than LONG_FIBER (split into several segments)."""
    rng = np.random.default_rng(seed)
    long_length = SEGMENT_NNZ + 500  # two segments
    dims = [long_length + 40 + 7 * m for m in range(order)]
    scattered = rng.integers(0, np.array(dims), size=(700, order))
    scattered[:, 0] = np.where(scattered[:, 0] // 10 % 3 == 1, 5, scattered[:, 0])  # empty slices
    pieces = [scattered]
    for mode in range(order):
        fiber = rng.integers(0, np.array(dims), size=order)
        block = np.tile(fiber, (long_length, 1))
        block[:, mode] = rng.choice(dims[mode], size=long_length, replace=False)
        pieces.append(block)
        short = np.tile(rng.integers(0, np.array(dims), size=order), (5, 1))  # a 5-long fiber
        short[:, mode] = rng.choice(dims[mode], size=5, replace=False)
        pieces.append(short)
    indices = np.concatenate(pieces)
    values = rng.standard_normal(len(indices))
    return COOTensor(indices.astype(np.int64), values, tuple(dims)).validate("test tensor")


def _giant_fiber_tensor(seed=1):
    """Order 3, mode 0: one fiber holds about 90 % of the nonzeros (split over chunks)."""
    rng = np.random.default_rng(seed)
    dims = (9000, 40, 30)
    giant = np.zeros((8000, 3), dtype=np.int64)
    giant[:, 0] = rng.choice(dims[0], size=8000, replace=False)
    giant[:, 1], giant[:, 2] = 17, 3
    rest = rng.integers(0, np.array(dims), size=(900, 3))
    indices = np.concatenate([giant, rest])
    return COOTensor(indices, rng.uniform(-1, 1, len(indices)), dims).validate("giant")


def numpy_sptv(tensor, mode, v):
    """Y = X x_mode v by hand: group nonzeros by their other coordinates, sum value * v[i_mode].

    Returns ``(coords, values)`` sorted lexicographically."""
    other = [m for m in range(tensor.order) if m != mode]
    coords, inverse = np.unique(tensor.indices[:, other], axis=0, return_inverse=True)
    products = tensor.values * v[tensor.indices[:, mode]]
    sums = np.zeros(len(coords))
    np.add.at(sums, inverse.ravel(), products)
    return coords, sums


def _vector(size, seed=0):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, size)  # params.vector: random


def _config(tmp_path, input_path, params, out="out", run=None, **sections):
    """An SpTV run config on ``input_path`` with results under ``tmp_path/out``."""
    return write_config(tmp_path, "sptv", params, out=out,
                        run=dict({"progress": False}, **(run or {})),
                        input={"path": str(input_path)}, **sections)


def _assert_close(values, reference, rtol):
    """Max-norm relative error of ``values`` against ``reference`` at most ``rtol``."""
    scale = np.abs(reference).max()
    assert np.abs(values - reference).max() <= rtol * scale


def _check_y(arrays, tensor, mode, rtol=1e-12):
    """``/result`` of a run against the NumPy SpTV of ``tensor`` (with v = params.vector
    random)."""
    coords, values = arrays["coords"], arrays["values"]
    order = np.lexsort(coords.T[::-1])
    ref_coords, ref_values = numpy_sptv(tensor, mode, _vector(tensor.shape[mode]))
    np.testing.assert_array_equal(coords[order], ref_coords)
    _assert_close(values[order], ref_values, rtol)


def _gpu_count():
    import pycuda.driver as cuda
    cuda.init()
    return cuda.Device.count()


def _run_inprocess(config):
    """Run ``config`` in this process; ``(read_results, /result arrays)``."""
    from hisparse.driver import run
    return read_run(run(str(config)))


def _reordered(tensor, mode):
    """The nonzeros of ``tensor`` as whole mode-``mode`` fibers in a random order (what the
    generator makes), and in any order."""
    reference = FiberTensor.from_coo(tensor, mode)
    rng = np.random.default_rng(0)
    fiber_order = rng.permutation(reference.nfibers)
    lengths = reference.fiber_lengths[fiber_order]
    by_fiber = np.repeat(reference.fiber_ptr[:-1][fiber_order]
                         - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) \
        + np.arange(tensor.nnz)
    return [COOTensor(tensor.indices[p], tensor.values[p], tensor.shape)
            for p in (by_fiber, rng.permutation(tensor.nnz))]


# -- the format ---------------------------------------------------------------------------------

@pytest.mark.parametrize("order", [3, 4, 5])
def test_fiber_tensor_matches_fibers_by_hand(order):
    tensor = _special_tensor(order)
    for mode in range(order):
        fibers = FiberTensor.from_coo(tensor, mode)
        other = [m for m in range(order) if m != mode]
        coords, inverse = np.unique(tensor.indices[:, other], axis=0, return_inverse=True)
        inverse = inverse.ravel()
        np.testing.assert_array_equal(fibers.fiber_coords, coords)
        assert (np.diff(fibers.fiber_ptr) >= 1).all()  # no empty fiber stored
        np.testing.assert_array_equal(fibers.fiber_lengths, np.bincount(inverse))
        np.testing.assert_array_equal(
            fibers.fibers_per_slice, np.bincount(coords[:, 0], minlength=tensor.shape[other[0]]))
        for f in (0, len(coords) // 2, len(coords) - 1, int(np.argmax(np.bincount(inverse)))):
            lo, hi = fibers.fiber_ptr[f], fibers.fiber_ptr[f + 1]
            mine = sorted(zip(fibers.fiber_index[lo:hi].tolist(), fibers.values[lo:hi]))
            theirs = sorted(zip(tensor.indices[inverse == f, mode].tolist(),
                                tensor.values[inverse == f]))
            assert mine == theirs
        assert fibers.fiber_index.dtype == np.uint16  # every mode here has < 65536 indices


def test_fiber_tensor_does_not_depend_on_input_order():
    tensor = _special_tensor(4, seed=6)
    mode = 3
    reference = FiberTensor.from_coo(tensor, mode)
    for moved in _reordered(tensor, mode):
        fibers = FiberTensor.from_coo(moved, mode)
        np.testing.assert_array_equal(fibers.fiber_ptr, reference.fiber_ptr)
        np.testing.assert_array_equal(fibers.fiber_coords, reference.fiber_coords)
        for f in range(0, reference.nfibers, 97):
            lo, hi = reference.fiber_ptr[f], reference.fiber_ptr[f + 1]
            assert sorted(zip(fibers.fiber_index[lo:hi].tolist(), fibers.values[lo:hi])) == \
                sorted(zip(reference.fiber_index[lo:hi].tolist(), reference.values[lo:hi]))


def _format_inputs():
    """``(tensor, mode)`` for every format test input: each mode of 3-, 4- and 5-order tensors
    with empty slices, short and long fibers; the giant fiber; whole fibers in a random order
    and nonzeros in any order; an empty and a one-nonzero tensor."""
    for order in (3, 4, 5):
        tensor = _special_tensor(order)
        for mode in range(order):
            yield tensor, mode
    yield _giant_fiber_tensor(), 0
    for moved in _reordered(_special_tensor(4, seed=6), 3):
        yield moved, 3
    yield COOTensor(np.zeros((0, 3), np.int64), np.zeros(0), (4, 5, 6)), 1
    yield COOTensor(np.array([[1, 2, 3]]), np.array([2.0]), (4, 5, 6)), 1


@pytest.mark.parametrize("module", ARRAY_MODULES)
def test_format_and_plan_by_sort_equal_the_host_builders(module):
    """The builders the GPU runs (sort-based format, chunk plan packed where the fibers are)
    give exactly what the host builders give, on every test input."""
    xp = array_module_named(module)
    fields = ("fiber_ptr", "fiber_index", "values", "fiber_coords", "fibers_per_slice")
    for tensor, mode in _format_inputs():
        host = FiberTensor.from_coo(tensor, mode)
        built = fibers_by_sort(xp, xp.asarray(tensor.indices), xp.asarray(tensor.values),
                               tensor.shape, mode).to_host()
        for name in fields:
            mine, theirs = getattr(built, name), getattr(host, name)
            assert mine.dtype == theirs.dtype, name
            np.testing.assert_array_equal(mine, theirs, err_msg=name)
        if module == "numpy":
            continue  # build_plan is one code for both: compare it where xp differs
        device = fibers_by_sort(xp, xp.asarray(tensor.indices), xp.asarray(tensor.values),
                                tensor.shape, mode)
        for chunks in (1, 5):
            expected = build_plan(host, chunks, np.int32, 256)
            plan = build_plan(device, chunks, np.int32, 256, xp=xp)
            assert plan.chunks == expected.chunks and plan.nfibers == expected.nfibers
            for chunk in plan.chunks:
                for name in chunk.layout:  # array by array: the padding is not initialised
                    np.testing.assert_array_equal(plan.view(chunk, name).get(),
                                                  expected.view(chunk, name))


# -- the partition ------------------------------------------------------------------------------

def test_grid_shapes_are_all_factorisations():
    assert sorted(grid_shapes(4, 2)) == [(1, 4), (2, 2), (4, 1)]
    assert all(np.prod(s) == 12 for s in grid_shapes(12, 3))
    assert len(grid_shapes(12, 3)) == 18


@pytest.mark.parametrize("strategy", ["grid_nnz", "grid_uniform"])
@pytest.mark.parametrize("nparts", [2, 3, 4])
def test_partition_owns_whole_fibers_and_reports_imbalance(strategy, nparts):
    tensor = _special_tensor(4, seed=5)
    mode = 2
    part = partition_tensor(tensor.indices, tensor.shape, mode, nparts, strategy)
    owner = part.part_of(tensor.indices)
    counts = np.bincount(owner, minlength=nparts)
    np.testing.assert_array_equal(part.nnz_per_part, counts)
    assert part.imbalance == pytest.approx(counts.max() / counts.mean())
    # Every fiber lies in one part: nonzeros sharing the other coordinates share the owner.
    other = [m for m in range(4) if m != mode]
    _, inverse = np.unique(tensor.indices[:, other], axis=0, return_inverse=True)
    inverse = inverse.ravel()
    first_owner = np.zeros(inverse.max() + 1, dtype=np.int64)
    first_owner[inverse] = owner
    np.testing.assert_array_equal(first_owner[inverse], owner)
    # Each part is the box its ranges say.
    for p in range(nparts):
        mine = tensor.indices[owner == p]
        for m, (lo, hi) in zip(part.other_modes, part.block_ranges(p)):
            assert ((mine[:, m] >= lo) & (mine[:, m] < hi)).all()


def test_nnz_grid_balances_a_skewed_tensor_better_than_uniform():
    rng = np.random.default_rng(2)
    indices = np.stack([rng.integers(0, 100, 20000) ** 2 // 100,  # skewed towards 0
                        rng.integers(0, 80, 20000) ** 3 // 6400, rng.integers(0, 60, 20000)],
                       axis=1)
    nnz_part = partition_tensor(indices, (100, 80, 60), 2, 4, "grid_nnz")
    uniform = partition_tensor(indices, (100, 80, 60), 2, 4, "grid_uniform")
    assert nnz_part.imbalance < uniform.imbalance
    assert nnz_part.imbalance < 1.05


# -- the chunk plan -----------------------------------------------------------------------------

def test_chunks_cut_at_fiber_starts_and_split_only_a_giant_fiber():
    ptr = np.array([0, 3, 5, 9, 10, 14, 20], dtype=np.int64)
    bounds = chunk_bounds(ptr, 3)
    assert bounds[0] == 0 and bounds[-1] == 20
    assert set(bounds.tolist()) <= set(ptr.tolist())
    giant = np.array([0, 1, 1000, 1002], dtype=np.int64)
    bounds = chunk_bounds(giant, 4)
    assert len(bounds) == 5 and (np.diff(bounds) > 0).all()
    assert np.diff(bounds).max() <= 1002 // 4 + 2


def test_plan_bins_cover_every_fiber_once():
    tensor = _special_tensor(3, seed=4)
    fibers = FiberTensor.from_coo(tensor, 1)
    plan = build_plan(fibers, 3, np.int32, 256)
    assert sum(c.nnz for c in plan.chunks) == fibers.nnz
    for chunk in plan.chunks:
        out_id, long_fiber = plan.view(chunk, "out_id"), plan.view(chunk, "long_fiber")
        # Y slots from the chunk's first fiber: chunk-local fiber j at j, the piece of a fiber
        # an earlier chunk started at the chunk's side slot.
        layout = np.concatenate([out_id, long_fiber]).astype(np.int64)
        if chunk.continues:
            layout[layout == chunk.side_slot - chunk.fiber_first] = 0
        np.testing.assert_array_equal(np.sort(layout), np.arange(chunk.nfibers))
        ptr, val = plan.view(chunk, "ptr"), plan.view(chunk, "val")
        lengths = np.diff(ptr)
        assert (lengths[:len(out_id)] <= LONG_FIBER).all()
        assert (lengths[len(out_id):] > LONG_FIBER).all()
        # The bin layout moves whole fibers: position p holds the nonzeros of fiber layout[p].
        for p in (0, len(layout) // 2, len(layout) - 1):
            f = chunk.fiber_first + layout[p]
            lo = max(fibers.fiber_ptr[f], chunk.nnz_lo)
            hi = min(fibers.fiber_ptr[f + 1], chunk.nnz_hi)
            np.testing.assert_array_equal(val[ptr[p]:ptr[p + 1]], fibers.values[lo:hi])
    assert sum(c.nlong for c in plan.chunks) >= 1
    assert parse_bytes("64MiB") == 64 << 20 and parse_bytes("2GB") == 2 * 10 ** 9


def test_chunks_write_distinct_y_slots_and_split_pieces_go_past_the_fibers():
    """Chunks run concurrently on several streams, all writing the rank's Y: no two may write
    the same slot. A fiber split over chunks is written once by the chunk that starts it and
    once per continuing chunk into that chunk's slot past the fibers (the split table)."""
    fibers = FiberTensor.from_coo(_giant_fiber_tensor(), 0)
    plan = build_plan(fibers, 6, np.int32, 256)
    continuing = [c for c in plan.chunks if c.continues]
    assert len(continuing) >= 3 and plan.y_length == fibers.nfibers + len(plan.chunks)
    split_fibers, split_slots = plan.split_table()
    np.testing.assert_array_equal(split_fibers, [c.fiber_first for c in continuing])
    np.testing.assert_array_equal(split_slots, [fibers.nfibers + c.index for c in continuing])
    written = np.concatenate([c.fiber_first + np.concatenate(
        [plan.view(c, "out_id"), plan.view(c, "long_fiber")]).astype(np.int64)
        for c in plan.chunks])
    assert len(np.unique(written)) == len(written)
    np.testing.assert_array_equal(np.sort(written), np.sort(np.concatenate(
        [np.arange(fibers.nfibers), split_slots])))


# -- the engines on one rank's block ------------------------------------------------------------

def _engine_products(tmp_path, backend, execution, fibers, v, chunks):
    """Y of the engine ``pick_engine`` gives ``backend`` on ``fibers`` (the local data of one
    rank), once per chunk order; the engine's peak device bytes; and what the engine reads of
    its Y after the products (checksums, sampled runs) with its device bytes and the plan's."""
    device = bind_gpu(backend)
    ctx = run_context(tmp_path, "sptv", {"chunks": chunks, "execution": execution}, backend,
                      device, input={"path": str(tmp_path / "x.h5")}, gpu={"streams": 3})
    config = ctx.config
    pointer_dtype = np.dtype(np.int32)
    engine = engine_for(ctx, RankBlock(fibers, v, pointer_dtype), execution)
    try:
        assert engine.BACKEND == backend
        plan = fit_plan(fibers, config["operation.params"], config["gpu.streams"],
                        config["gpu.block_size"], pointer_dtype, v.nbytes,
                        engine.host_allocator())
        engine.upload(plan)
        products = {}
        for order in ("stored", "nnz_desc"):
            engine.multiply(order)
            products[order] = np.array(engine.values())
        runs = sample_runs(fibers.nfibers)
        after = {"checksums": engine.checksums(), "runs": runs, "taken": engine.take(runs),
                 "device_bytes": engine.device_bytes,
                 "plan_device_bytes": plan.device_bytes(execution == "resident",
                                                        config["gpu.streams"],
                                                        fibers.values.dtype.itemsize, v.nbytes)}
        return products, engine.memory_stats()["peak_device_bytes"], after
    finally:
        engine.free()
        if device is not None:
            device.release()


@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
@pytest.mark.parametrize("execution", ["resident", "streaming"])
def test_engines_agree_on_one_rank_block(tmp_path, backend, execution):
    """Each backend's engine on the same local block (short, long and chunk-split fibers) gives
    the NumPy SpTV of it; a non-CPU engine also matches the CPU engine to rounding."""
    for tensor, mode, chunks in ((_special_tensor(4, seed=2), 1, 5),
                                 (_giant_fiber_tensor(), 0, 6)):
        v = _vector(tensor.shape[mode], seed=3)
        fibers = FiberTensor.from_coo(tensor, mode)
        ref_coords, ref_values = numpy_sptv(tensor, mode, v)
        np.testing.assert_array_equal(fibers.fiber_coords, ref_coords)  # Y's slots, in order
        products, peak, after = _engine_products(tmp_path, backend, execution, fibers, v,
                                                 chunks)
        assert (peak > 0) == (backend == "gpu")  # the arena records the GPU engine's memory
        if backend != "cpu":
            on_cpu, _, _ = _engine_products(tmp_path, "cpu", execution, fibers, v, chunks)
            assert after["device_bytes"] == after["plan_device_bytes"]
        for order, y in products.items():
            _assert_close(y, ref_values, 1e-12)
            if backend != "cpu":
                _assert_close(y, on_cpu[order], 1e-12)
        # Read where Y stays: its sums and sampled runs (the last product's Y).
        y = products["nnz_desc"]
        np.testing.assert_allclose(after["checksums"], [y.sum(), np.dot(y, y)], rtol=1e-12)
        rows = np.concatenate([np.arange(a, b) for a, b in after["runs"]])
        assert len(rows) == 256 and (np.diff(rows) > 0).all()
        np.testing.assert_array_equal(after["taken"], y[rows])


# -- end to end, CPU ------------------------------------------------------------------------------

@pytest.mark.parametrize("order,mode", [(3, 0), (3, 1), (3, 2), (4, 0), (4, 1), (4, 2), (4, 3),
                                        (5, 0), (5, 1), (5, 2), (5, 3), (5, 4)])
@pytest.mark.parametrize("chunk_order", ["stored", "nnz_desc"])
def test_sptv_cpu_every_mode(tmp_path, order, mode, chunk_order):
    tensor = _special_tensor(order)
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": mode, "chunks": 5,
                                                   "chunk_order": chunk_order}, backend="cpu")
    run, arrays = _run_inprocess(config)
    _check_y(arrays, tensor, mode)
    assert run["attrs"]["verify_passed"]
    assert int(np.sum(run["rank_vars"]["nnz"])) == tensor.nnz
    assert int(np.sum(run["rank_vars"]["long_fibers"])) >= 1


@pytest.mark.parametrize("execution", ["resident", "streaming"])
def test_sptv_cpu_giant_fiber_split_over_chunks(tmp_path, execution):
    tensor = _giant_fiber_tensor()
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": 0, "chunks": 6,
                                                   "execution": execution}, backend="cpu")
    run, arrays = _run_inprocess(config)
    _check_y(arrays, tensor, 0)
    assert int(run["rank_vars"]["split_fibers"][0]) >= 3  # the giant fiber spans >= 4 chunks


def _streaming_under_cap(tmp_path, cap, **sections):
    """Streaming SpTV of a 4-order tensor under ``device_memory_cap: cap``, checked against
    NumPy; returns the tensor and the per-rank ``/perf`` values."""
    tensor = _special_tensor(4, seed=9)
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5",
                     {"mode": 3, "chunks": 1, "execution": "streaming",
                      "device_memory_cap": cap}, **sections)
    run, arrays = _run_inprocess(config)
    _check_y(arrays, tensor, 3)
    return tensor, run["rank_vars"]


def test_sptv_streaming_fits_a_memory_cap_smaller_than_the_tensor(tmp_path):
    cap = 128 * 1024  # over v and Y (which stay on the device), under the tensor
    _, info = _streaming_under_cap(tmp_path, cap, backend="cpu")
    assert int(info["tensor_bytes"][0]) > cap          # the tensor does not fit ...
    assert int(info["streaming_device_bytes"][0]) <= cap  # ... its streaming buffers do
    assert int(info["chunks"][0]) > 1


def test_sptv_resident_over_the_cap_is_refused(tmp_path):
    tensor = _special_tensor(3, seed=9)
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5",
                     {"execution": "resident", "device_memory_cap": "4KiB"}, backend="cpu")
    proc = run_config(tmp_path, config, expect_rc=2)
    assert "device_memory_cap" in proc.stderr and "streaming" in proc.stderr


def _by_coords(arrays):
    """``/result`` values in lexicographic order of their fiber coordinates."""
    return arrays["values"][np.lexsort(arrays["coords"].T[::-1])]


@pytest.mark.parametrize("nprocs", [2, 4])
def test_sptv_cpu_ranks(tmp_path, nprocs):
    """Y at several ranks against NumPy; with one chunk per rank (no fiber split over chunks:
    each fiber is summed in the same order wherever it lives) identical to one rank."""
    for name, tensor, mode, chunks in (("a", _special_tensor(4, seed=3), 1, 1),
                                       ("b", _giant_fiber_tensor(), 0, 3)):
        write_tensor(tmp_path / f"{name}.h5", tensor)
        config = _config(tmp_path, tmp_path / f"{name}.h5", {"mode": mode, "chunks": chunks},
                         backend="cpu", out=name)
        run, arrays = run_config(tmp_path, config, nprocs=nprocs, out=name)
        _check_y(arrays, tensor, mode)
        nnz = np.asarray(run["rank_vars"]["nnz"])
        assert len(nnz) == nprocs and int(nnz.sum()) == tensor.nnz
        assert run["attrs"]["sptv_rank_nnz"] == ",".join(str(int(n)) for n in nnz)
        assert run["attrs"]["sptv_nnz_imbalance"] == pytest.approx(nnz.max() / nnz.mean())
        if chunks == 1:
            one = _config(tmp_path, tmp_path / f"{name}.h5", {"mode": mode, "chunks": 1},
                          backend="cpu", out=f"{name}1", name="one.yaml")
            np.testing.assert_array_equal(_by_coords(arrays), _by_coords(_run_inprocess(one)[1]))


def test_sptv_repeat_is_the_product_alone_and_collect_runs_once(tmp_path):
    """Per repeat only the product (no copy back, gather or host combine); Y reaches rank 0
    once, in the driver's collect phase."""
    tensor = _giant_fiber_tensor()
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": 0, "chunks": 6}, backend="cpu",
                     run={"repeats": 3})
    run, arrays = _run_inprocess(config)
    _check_y(arrays, tensor, 0)
    phases, kinds = run["phases"], run["phase_kinds"]
    assert not {"gather", "d2h"} & set(phases)
    repeat_kinds = {kinds[p] for p in SpTV.REPEAT_PHASES}
    assert repeat_kinds == {"compute", "detail"}  # nothing but the product is summed
    collect = np.asarray(run["wall"])[:, :, phases.index("collect")]
    assert np.isfinite(collect[0]).all() and np.isnan(collect[1:]).all()
    assert kinds["collect"] == "collect" and run["attrs"]["sptv_collect"] == "gather"


def test_sptv_without_verification_or_stored_result_leaves_y_on_the_ranks(tmp_path):
    """Nothing to verify or store: Y is not read back; only its checksums reach rank 0."""
    tensor = _special_tensor(3, seed=8)
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": 2, "store_result": False},
                     backend="cpu", verify={"enabled": False})
    run, arrays = _run_inprocess(config)
    assert arrays == {} and not run["attrs"]["verify_enabled"]
    _, ref = numpy_sptv(tensor, 2, _vector(tensor.shape[2]))
    assert run["attrs"]["sptv_y_sum"] == pytest.approx(ref.sum(), rel=1e-12, abs=1e-12)
    assert run["attrs"]["sptv_y_sum_of_squares"] == pytest.approx(np.dot(ref, ref), rel=1e-12)


@pytest.mark.parallel(nprocs=[1, 2, 4])
@pytest.mark.parametrize("backend", ENGINE_BACKENDS)
def test_sptv_y_left_on_ranks_verifies_by_checksums(tmp_path, nprocs, backend, monkeypatch):
    """``output.collect: none``: Y stays on the ranks; rank 0 verifies the reduced checksums
    and the sampled fibers against the reference, and stores no /result."""
    from mpi4py import MPI
    from hisparse.driver import run
    from hisparse.parallel import get_world
    comm = get_world()
    if backend == "gpu" and _gpu_count() < comm.size:
        pytest.skip("one GPU per rank")
    monkeypatch.setattr(SpTV, "collect_mode", lambda self: "none")
    tensor = _giant_fiber_tensor()
    write_tensor(tmp_path / "x.h5", tensor)  # each rank its own copy; rank 0's is read
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": 0, "chunks": 5}, backend=backend)
    path = run(str(config))
    ok = True
    if comm.rank == 0:
        result, arrays = read_run(path)
        attrs = result["attrs"]
        _, ref = numpy_sptv(tensor, 0, _vector(tensor.shape[0]))
        ok = (arrays == {} and attrs["verify_enabled"] and attrs["verify_passed"]
              and attrs["verify_max_rel_error"] <= 1e-12 and attrs["sptv_collect"] == "none"
              and np.isclose(attrs["sptv_y_sum"], ref.sum(), rtol=1e-12, atol=1e-12)
              and np.isclose(attrs["sptv_y_sum_of_squares"], np.dot(ref, ref), rtol=1e-12))
    assert comm.allreduce(bool(ok), op=MPI.LAND)


def test_checksums_and_samples_catch_wrong_missing_and_misplaced_values():
    tensor = _special_tensor(3, seed=4)
    mode = 1
    coords, ref = numpy_sptv(tensor, mode, _vector(tensor.shape[mode]))
    dims = [tensor.shape[m] for m in range(3) if m != mode]

    def checks(values, sampled=slice(None)):
        rows = np.arange(len(values))[sampled]
        return YChecks(len(values), float(values.sum()), float(np.dot(values, values)),
                       coords[rows], values[rows])

    assert checks(ref).error((coords, ref), dims) <= 1e-15
    assert checks(ref * (1 + 1e-14)).error((coords, ref), dims) <= 1e-13
    wrong = ref.copy()
    wrong[len(ref) // 3] += 1e-6 * np.abs(ref).max()  # one fiber, not sampled: the sums see it
    assert checks(wrong, slice(0, 10)).error((coords, ref), dims) > 1e-11
    swapped = ref.copy()
    swapped[[5, 6]] = swapped[[6, 5]]  # a misplaced pair: sums unchanged, the samples see it
    assert swapped[5] != swapped[6]
    assert checks(swapped).error((coords, ref), dims) >= abs(ref[5] - ref[6]) / \
        np.abs(ref).max() - 1e-15
    rest = ref[1:]  # fiber 0 missing from Y ...
    missing = YChecks(len(rest), float(rest.sum()), float(np.dot(rest, rest)), coords[1:6],
                      rest[:5])
    assert missing.error((coords, ref), dims) == np.inf
    # ... or a sampled fiber the reference does not have
    stray = YChecks(len(rest), float(rest.sum()), float(np.dot(rest, rest)), coords[:5], ref[:5])
    assert stray.error((coords[1:], rest), dims) == np.inf


# -- GPU ----------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("order", [3, 4, 5])
@pytest.mark.parametrize("execution", ["resident", "streaming"])
def test_sptv_gpu_every_mode(tmp_path, order, execution):
    tensor = _special_tensor(order)
    write_tensor(tmp_path / "x.h5", tensor)
    for mode in range(order):
        for chunk_order in ("stored", "nnz_desc"):
            config = _config(tmp_path, tmp_path / "x.h5",
                             {"mode": mode, "chunks": 4, "chunk_order": chunk_order,
                              "execution": execution, "format_on": "device"},
                             backend="gpu", gpu={"streams": 3})
            run, arrays = _run_inprocess(config)
            _check_y(arrays, tensor, mode)
            # Resident: the format and plan are built on the GPU (CuPy); streaming: on the host.
            assert run["attrs"]["sptv_format_on"] == \
                ("device" if execution == "resident" else "host")
            assert int(run["rank_vars"]["device_bytes"][0]) > 0


@pytest.mark.gpu
def test_sptv_gpu_format_on(tmp_path):
    """``format_on``: a small tensor is built on the host under auto (CuPy's start-up would cost
    more), on the device when asked; the same Y either way."""
    tensor = _special_tensor(4)
    write_tensor(tmp_path / "x.h5", tensor)
    for place, built in (("auto", "host"), ("device", "device"), ("host", "host")):
        config = _config(tmp_path, tmp_path / "x.h5", {"mode": 1, "format_on": place},
                         out=f"out_{place}", backend="gpu")
        run, arrays = _run_inprocess(config)
        _check_y(arrays, tensor, 1)
        assert run["attrs"]["sptv_format_on"] == built


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [1, 2, 3, 4, 5, 6, 7, 8])
def test_sptv_gpu_streams(tmp_path, streams):
    tensor = _giant_fiber_tensor()
    write_tensor(tmp_path / "x.h5", tensor)
    for execution in ("resident", "streaming"):
        config = _config(tmp_path, tmp_path / "x.h5",
                         {"mode": 0, "chunks": 9, "execution": execution},
                         backend="gpu", gpu={"streams": streams})
        _check_y(_run_inprocess(config)[1], tensor, 0)


@pytest.mark.gpu
def test_sptv_gpu_streaming_under_cap_and_fp32(tmp_path):
    cap = 128 * 1024  # over v and Y (which stay on the device), under the tensor
    tensor, info = _streaming_under_cap(tmp_path, cap, backend="gpu", gpu={"streams": 2})
    assert int(info["tensor_bytes"][0]) > cap >= int(info["device_bytes"][0])
    assert int(info["peak_device_bytes"][0]) >= int(info["device_bytes"][0])
    config = _config(tmp_path, tmp_path / "x.h5", {"mode": 1}, backend="gpu", precision="fp32")
    _check_y(_run_inprocess(config)[1], tensor, 1, rtol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("nprocs", [2, 4])
def test_sptv_gpu_ranks(tmp_path, nprocs):
    tensor = _special_tensor(4, seed=3)
    write_tensor(tmp_path / "x.h5", tensor)
    for execution in ("resident", "streaming"):
        config = _config(tmp_path, tmp_path / "x.h5",
                         {"mode": 2, "chunks": 3, "execution": execution},
                         backend="gpu", out=execution)
        _check_y(run_config(tmp_path, config, nprocs=nprocs, out=execution)[1], tensor, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("streams", [1, 3])
def test_sptv_gpu_graph_replay_equals_direct_launches(tmp_path, streams):
    """Resident products replayed from a CUDA graph (gpu.graphs, the default) give the same Y,
    bit for bit, as products launched chunk by chunk, on a tensor with long and split fibers
    (every kernel of a product, and the split combine, inside the graph)."""
    tensor = _giant_fiber_tensor()
    write_tensor(tmp_path / "x.h5", tensor)
    ys = {}
    for graphs in (True, False):
        config = _config(tmp_path, tmp_path / "x.h5", {"mode": 0, "chunks": 9},
                         backend="gpu", gpu={"streams": streams, "graphs": graphs},
                         out=f"graphs_{graphs}")
        run, arrays = _run_inprocess(config)
        _check_y(arrays, tensor, 0)
        ys[graphs] = arrays
        combine = run["gpu"][:, :, run["phases"].index("combine")]
        # a replay is timed as a whole; launched chunk by chunk, the combine is timed apart
        assert np.all(np.isnan(combine)) if graphs else np.all(np.isfinite(combine))
    for name in ys[True]:
        np.testing.assert_array_equal(ys[True][name], ys[False][name])


@pytest.mark.gpu
@pytest.mark.parametrize("precision,index_width,sigma,narrow", [("fp64", "auto", None, None),
                                                                ("fp32", "int64", None, None),
                                                                ("fp64", "auto", 3, None),
                                                                ("fp64", "auto", None, False),
                                                                ("fp32", "int64", 5, False)])
def test_sptv_gpu_csr5_kernel_every_mode(tmp_path, precision, index_width, sigma, narrow):
    """kernel: csr5 (the fibers as CSR5 rows, SpMV's kernels) gives the reference Y in every
    mode, on 4-mode tensors and on one fiber holding most nonzeros (a row over many tiles),
    with the default tile height and a given one, and with the mode-n indices read as 16-bit
    (the default on these small modes) or at the index width."""
    rtol = 1e-5 if precision == "fp32" else 1e-12
    cases = [(_special_tensor(4), range(4)), (_giant_fiber_tensor(), [0])]
    for number, (tensor, modes) in enumerate(cases):
        write_tensor(tmp_path / f"x{number}.h5", tensor)
        for mode in modes:
            out = f"csr5_{number}_{mode}"
            config = _config(tmp_path, tmp_path / f"x{number}.h5",
                             {"mode": mode, "kernel": "csr5", "sigma": sigma,
                              "narrow_columns": narrow}, backend="gpu",
                             out=out, precision=precision, index_width=index_width)
            run, arrays = _run_inprocess(config)
            _check_y(arrays, tensor, mode, rtol=rtol)
            assert run["attrs"]["verify_passed"]
            wide = 64 if index_width == "int64" else 32
            assert list(run["rank_vars"]["column_index_bits"]) == [16 if narrow is None else wide]


def test_sptv_csr5_kernel_needs_resident_execution(tmp_path):
    tensor = _special_tensor(3)
    write_tensor(tmp_path / "x.h5", tensor)
    config = _config(tmp_path, tmp_path / "x.h5",
                     {"mode": 1, "kernel": "csr5", "execution": "streaming"})
    with pytest.raises(Exception, match="kernel: csr5 needs"):
        _run_inprocess(config)


def test_format_on_auto_chooses_by_nonzeros_per_rank(monkeypatch):
    """``format_on: auto`` builds on the device from SpTV.DEVICE_FORMAT_MIN_NNZ nonzeros per
    rank (a generated tensor's from its spec, where it is also made; a file's once read), never
    for streaming or on the CPU; ``host`` and ``device`` are taken as said."""
    from types import SimpleNamespace

    from hisparse.gpu import _blas
    from hisparse.ops.sptv.op import SpTV
    device = object()
    monkeypatch.setattr(_blas, "import_cupy", lambda purpose: device)
    limit = SpTV.DEVICE_FORMAT_MIN_NNZ

    def op_for(spec_nnz=None, ranks=1, place="auto", backend="gpu", execution="resident"):
        op = object.__new__(SpTV)
        spec = None if spec_nnz is None else {"kind": "random_tensor", "nnz": spec_nnz}
        op.ctx = SimpleNamespace(backend=backend, size=ranks, config={"input.generate": spec})
        op.params = {"format_on": place, "execution": execution}
        return op

    def where(module):
        return "device" if module is device else "host"

    assert where(op_for(limit - 1).input_module()) == "host"
    assert where(op_for(limit).input_module()) == "device"
    assert where(op_for(4 * limit - 1, ranks=4).input_module()) == "host"
    assert where(op_for(4 * limit, ranks=4).input_module()) == "device"
    assert where(op_for().input_module()) == "host"  # a file: read on the host
    assert where(op_for()._format_module(limit - 1)) == "host"
    assert where(op_for()._format_module(limit)) == "device"
    assert where(op_for()._format_module(None)) == "device"  # count unknown: large
    assert where(op_for(place="device")._format_module(10)) == "device"
    assert where(op_for(place="host")._format_module(10 * limit)) == "host"
    assert where(op_for(execution="streaming")._format_module(10 * limit)) == "host"
    assert where(op_for(backend="cpu")._format_module(10 * limit)) == "host"


def test_the_driver_imports_cupy_early_exactly_where_the_format_is_built_on_the_device(
        monkeypatch):
    """``SpTV.modules_for_setup`` names CuPy for the GPU binding to import early where the
    format is built on the device as ``input_module``/``_format_module`` decide it (a generated
    tensor by its spec's count; a file only under ``format_on: device``), and nothing
    elsewhere; the driver's early import leaves a module that does not import to the setup."""
    from types import SimpleNamespace

    from hisparse import driver
    from hisparse.gpu import _blas
    from hisparse.ops.sptv.op import SpTV
    device = object()
    monkeypatch.setattr(_blas, "import_cupy", lambda purpose: device)
    limit = SpTV.DEVICE_FORMAT_MIN_NNZ
    for spec_nnz in (None, limit - 1, limit, 4 * limit):
        for ranks in (1, 4):
            for place in ("auto", "device", "host"):
                for execution in ("resident", "streaming"):
                    spec = None if spec_nnz is None else {"kind": "random_tensor",
                                                          "nnz": spec_nnz}
                    config = {"input.generate": spec,
                              "operation.params": {"format_on": place, "execution": execution}}
                    op = object.__new__(SpTV)
                    op.ctx = SimpleNamespace(backend="gpu", size=ranks, config=config)
                    op.params = config["operation.params"]
                    on_device = op.input_module() is device if spec is not None else \
                        place == "device" and op._format_module(None) is device
                    assert SpTV.modules_for_setup(config, ranks) == \
                        (("cupy",) if on_device else ()), (spec_nnz, ranks, place, execution)
    imported = []

    def import_module(name):
        imported.append(name)
        if name == "missing":
            raise ImportError(name)

    monkeypatch.setattr("importlib.import_module", import_module)
    driver._import_early(["missing", "present"])
    assert imported == ["missing", "present"]


def test_fiber_rows_are_put_in_lexicographic_order_by_keys_or_lexsort():
    """``lexicographic_order`` (verification's matching of Y's fibers): None for rows sorted
    already, else the permutation ``lexsort`` gives, through int64 keys or, when the key space
    passes int64, through ``lexsort`` itself."""
    from hisparse.ops.sptv.reference import lexicographic_order as _lexicographic_order
    rng = np.random.default_rng(8)
    for dims in ([7, 5, 9], [2 ** 40, 2 ** 30]):
        coords = np.stack([rng.integers(0, min(d, 50), 400) for d in dims], axis=1)
        want = np.lexsort(coords.T[::-1])
        got = _lexicographic_order(coords, dims)
        np.testing.assert_array_equal(coords[got], coords[want])
        unique = np.unique(coords, axis=0)
        assert _lexicographic_order(unique, dims) is None or \
            np.array_equal(unique[_lexicographic_order(unique, dims)], unique)
    sorted_rows = np.unique(np.stack([rng.integers(0, 9, 300) for _ in range(3)], axis=1), axis=0)
    assert _lexicographic_order(sorted_rows, [9, 9, 9]) is None
    assert _lexicographic_order(sorted_rows[::-1], [9, 9, 9]) is not None


@pytest.mark.parametrize("per_nonzero", [1e9, 0], ids=["dense", "sorted"])
def test_reference_fiber_sums_by_a_loop_over_nonzeros(monkeypatch, per_nonzero):
    # The verification's reference sums into a dense array of fiber positions or sorts the keys
    # (what it picks depends on positions per nonzero); both must equal a plain dictionary sum.
    from hisparse.ops.sptv import reference
    monkeypatch.setattr(reference, "DENSE_POSITIONS_PER_NONZERO", per_nonzero)
    rng = np.random.default_rng(5)
    shape, mode = (7, 11, 5), 1
    indices = np.stack([rng.integers(0, d, 300) for d in shape], axis=1)
    values = rng.standard_normal(300)
    vector = rng.standard_normal(shape[mode])
    expected = {}
    for (i, j, k), value in zip(indices.tolist(), values):
        key = (i, k)
        expected[key] = expected.get(key, 0.0) + value * vector[j]
    coords, sums = reference.fiber_sums(indices, values, shape, mode, vector)
    assert [tuple(c) for c in coords.tolist()] == sorted(expected)
    np.testing.assert_allclose(sums, [expected[key] for key in sorted(expected)], rtol=1e-12)

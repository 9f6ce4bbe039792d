"""Tensor input by parts (issue 13): every rank reads a slice of a COO file's nonzeros or
generates a range of a random tensor's fibers, the grid partition is cut collectively, and the
nonzeros move to their owners in one all-to-all.

References: the whole tensor read by :func:`hisparse.io.read_tensor` (or made by
:func:`hisparse.generators.random_tensor` in one piece) and split by
:func:`hisparse.partition._tensor.partition_tensor` as SpTV's rank-0 ``partition()`` splits it;
SpTV's results at one rank, and NumPy's product (the driver's verification).
"""
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hisparse import generators
from hisparse.generators import _tensor
from hisparse.formats import COOTensor
from hisparse.io import read_tensor
from hisparse.layout import (TensorProblem, TensorSlice, generate_tensor_slice, plan_tensor_grid,
                             read_tensor_slice)
from hisparse.io import _hyperslab
from hisparse.layout import _tensor as _tensor_parts
from hisparse.parallel import CollectiveError, gather_arrays, get_world
from hisparse.partition._tensor import TENSOR_STRATEGIES, partition_tensor

from helpers import run_config, write_config


def _all(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


def _shared_dir(comm):
    """One temporary directory for every rank (each rank is its own pytest process)."""
    path = tempfile.mkdtemp(prefix="hisparse-tensor-") if comm.rank == 0 else None
    return Path(comm.bcast(path, root=0))


def _rank0_part(whole, mode, nparts, rank, strategy):
    """What SpTV's rank-0 ``partition()`` gives rank ``rank``: its block's nonzeros in the
    whole tensor's order."""
    grid = partition_tensor(whole.indices, whole.shape, mode, nparts, strategy)
    take = np.flatnonzero(grid.part_of(whole.indices) == rank)
    return grid, whole.indices[take], whole.values[take]


def _same_grid(a, b):
    return (a.grid == b.grid and a.other_modes == b.other_modes and a.mode == b.mode and
            all(np.array_equal(x, y) for x, y in zip(a.cuts, b.cuts)) and
            np.array_equal(a.nnz_per_part, b.nnz_per_part))


def _awkward_tensor(seed=0):
    """Unsorted nonzeros of an order-4 tensor with repeated coordinates (some three times), an
    empty slice in every mode, and one long fiber."""
    rng = np.random.default_rng(seed)
    shape = (9, 11, 7, 13)
    nnz = 900
    indices = np.stack([rng.integers(0, s - 1, nnz) for s in shape], axis=1)  # last index empty
    indices[:60, :3] = (2, 3, 4)  # a long mode-3 fiber
    indices[60:120] = indices[120:180]  # duplicates
    indices[180:200] = indices[120:140]
    values = rng.standard_normal(nnz)
    order = rng.permutation(nnz)
    return COOTensor(indices[order], values[order], shape)


def _write_raw(path, tensor, per_mode=False, index_dtype=np.int64):
    """A COO group as the schema stores it, without the writer's checks (duplicates kept)."""
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = np.asarray(tensor.shape, dtype=np.int64)
        if per_mode:
            for m in range(tensor.order):
                handle.create_dataset(f"index{m}", data=tensor.indices[:, m].astype(index_dtype))
        else:
            handle.create_dataset("indices", data=tensor.indices.astype(index_dtype))
        handle.create_dataset("values", data=tensor.values)


def _parts_of(comm, problem, mode, strategy):
    """``(grid, part)``: the grid is cut again when merging duplicates changed the counts."""
    problem.plan(comm, mode, strategy)
    part = problem.take_part(comm)
    return problem.grid, part


# -- generating by parts --------------------------------------------------------------------------

TENSOR_SPECS = [
    {"kind": "random_tensor", "dims": [30, 40, 50], "nnz": 6000, "fibers_per_nnz": 0.15,
     "seed": 2},
    {"kind": "random_tensor", "dims": [7, 9, 11, 6], "nnz": 3000, "fibers_per_nnz": 0.3,
     "mode": 1, "seed": 5, "skew": 2.0},
]


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_generated_slices_make_the_whole_generators_tensor(nprocs, monkeypatch):
    comm = get_world()
    monkeypatch.setattr(_tensor, "TENSOR_FIBER_STEP", 97)  # many steps per rank
    ok = True
    for spec in TENSOR_SPECS:
        whole = generators.generate(spec)
        piece = generate_tensor_slice(comm, spec)
        ok = ok and piece.nnz == whole.nnz and piece.shape == whole.shape and piece.distinct
        pieces = gather_arrays(comm, {"indices": piece.indices, "values": piece.values})
        if comm.rank == 0:
            ok = ok and np.array_equal(np.concatenate([p["indices"] for p in pieces]),
                                       whole.indices)
            ok = ok and np.array_equal(np.concatenate([p["values"] for p in pieces]),
                                       whole.values)
        # At their owners: exactly what the rank-0 partition gives each rank, whether the grid's
        # fibers are the generator's (each rank makes its own fibers) or not (moved there).
        fiber_mode = len(spec["dims"]) - 1 if spec.get("mode") is None else spec["mode"]
        for mode, strategy in [(m, s) for m in (fiber_mode, (fiber_mode + 1) % len(spec["dims"]))
                               for s in TENSOR_STRATEGIES]:
            problem = TensorProblem(generate_tensor_slice(comm, spec))
            grid, part = _parts_of(comm, problem, mode, strategy)
            want_grid, want_indices, want_values = _rank0_part(whole, mode, comm.size,
                                                               comm.rank, strategy)
            ok = ok and _same_grid(grid, want_grid) and part["grid"] == list(want_grid.grid)
            ok = ok and np.array_equal(part["indices"], want_indices)
            ok = ok and np.array_equal(part["values"], want_values)
            ok = ok and part["mode"] == mode and problem.nnz == whole.nnz
    assert _all(comm, ok)


# -- reading by parts -----------------------------------------------------------------------------

@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_slices_read_by_rank_equal_the_whole_read_then_partitioned(nprocs, monkeypatch):
    comm = get_world()
    monkeypatch.setattr(_hyperslab, "TENSOR_READ_CHUNK", 37)
    folder = _shared_dir(comm)
    tensor = _awkward_tensor()
    files = {"one dataset": folder / "a.h5", "per mode": folder / "b.h5"}
    if comm.rank == 0:
        _write_raw(files["one dataset"], tensor)
        _write_raw(files["per mode"], tensor, per_mode=True, index_dtype=np.int32)
    comm.Barrier()
    ok = True
    for path in files.values():
        whole = read_tensor(path)  # sorted row-major, duplicates summed
        assert whole.nnz < tensor.nnz
        piece = read_tensor_slice(comm, str(path))
        ok = ok and piece.nnz == tensor.nnz and piece.shape == tensor.shape
        for strategy in TENSOR_STRATEGIES:
            for mode in (0, 3):
                for value_dtype in (np.float64, np.float32):
                    problem = TensorProblem(read_tensor_slice(comm, str(path)),
                                            value_dtype=value_dtype)
                    grid, part = _parts_of(comm, problem, mode, strategy)
                    cast = whole.astype(value_dtype)
                    want_grid, want_indices, want_values = _rank0_part(
                        cast, mode, comm.size, comm.rank, strategy)
                    ok = ok and _same_grid(grid, want_grid)
                    ok = ok and np.array_equal(part["indices"], want_indices)
                    ok = ok and part["values"].dtype == value_dtype
                    ok = ok and np.array_equal(part["values"], want_values)
                    ok = ok and problem.nnz == whole.nnz
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_the_grid_cut_from_slices_is_the_whole_tensors(nprocs):
    """Any split of the nonzeros over the ranks (here uneven, one rank empty at 4) gives the
    grid partition_tensor cuts from the whole tensor."""
    comm = get_world()
    tensor = generators.random_tensor([12, 30, 8, 20], 4000, 0.2, mode=2, seed=4, skew=1.5)
    bounds = np.array([0, 100, 2500, 2500, tensor.nnz])[:comm.size + 1]
    bounds[-1] = tensor.nnz
    mine = tensor.indices[bounds[comm.rank]:bounds[comm.rank + 1]]
    ok = True
    for strategy in TENSOR_STRATEGIES:
        for mode in range(4):
            grid = plan_tensor_grid(comm, mine, tensor.shape, mode, strategy)
            ok = ok and _same_grid(grid, partition_tensor(tensor.indices, tensor.shape, mode,
                                                          comm.size, strategy))
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2, 4])
def test_a_bad_slice_stops_every_rank_naming_the_file_and_the_nonzero(nprocs):
    comm = get_world()
    folder = _shared_dir(comm)
    good = _awkward_tensor(seed=1)
    last = good.nnz - 3  # read by the last rank
    cases = {}
    values = good.values.copy()
    values[last] = np.inf
    cases["inf"] = (good.indices, values,
                    rf"inf.h5:/: value inf \(NaN/Inf\) at nonzero {last} \(coordinates \(")
    indices = good.indices.copy()
    indices[last, 2] = 7
    cases["index"] = (indices, good.values,
                      rf"index.h5:/: index 7 out of range \[0, 7\) in mode 2 at nonzero {last}")
    indices = good.indices.copy()
    indices[last, 1] = -1
    cases["negative"] = (indices, good.values,
                         rf"negative.h5:/: index -1 out of range \[0, 11\) in mode 1 at "
                         rf"nonzero {last}")
    for name, (ind, val, _) in cases.items():
        if comm.rank == 0:
            _write_raw(folder / f"{name}.h5", COOTensor(ind, val, good.shape))
    if comm.rank == 0:
        _write_raw(folder / "dup.h5", good)
        with h5py.File(folder / "short.h5", "w") as handle:
            handle.attrs["shape"] = np.asarray(good.shape)
            handle.create_dataset("indices", data=good.indices)
            handle.create_dataset("values", data=good.values[:-1])
    comm.Barrier()
    for name, (_, _, message) in cases.items():
        with pytest.raises(CollectiveError, match=f"rank {comm.size - 1}: .*{message}"):
            read_tensor_slice(comm, str(folder / f"{name}.h5"))
    with pytest.raises(CollectiveError, match=rf"short.h5:/: {good.nnz} coordinates but "
                                              rf"{good.nnz - 1} values"):
        read_tensor_slice(comm, str(folder / "short.h5"))
    # Duplicates: rejected on request, naming the coordinates and where the repeat lies in the
    # file (a position whose coordinates came earlier in the file too).
    problem = TensorProblem(read_tensor_slice(comm, str(folder / "dup.h5"), duplicates="reject"),
                            duplicates="reject", label=f"{folder / 'dup.h5'}:/")
    problem.plan(comm, 3, "grid_nnz")
    with pytest.raises(CollectiveError, match=r"dup.h5:/: duplicate coordinates \((.*)\) "
                                              r"\(nonzero (\d+)\); set input.duplicates: sum") \
            as error:
        problem.take_part(comm)
    named = str(error.value).split("duplicate coordinates (")[1]
    coordinates = tuple(int(c) for c in named.split(")")[0].split(", "))
    position = int(named.split("(nonzero ")[1].split(")")[0])
    assert tuple(good.indices[position]) == coordinates
    assert (good.indices[:position] == coordinates).all(axis=1).any()


def test_tensor_problem_loads_the_whole_tensor_only_when_asked():
    whole = generators.random_tensor([6, 7, 8], 200, 0.2, seed=1)
    calls = []

    def load():
        calls.append(1)
        return whole

    piece = TensorSlice(whole.indices, whole.values, whole.shape, whole.nnz, distinct=True)
    problem = TensorProblem(piece, load, value_dtype=np.float32)
    assert (problem.shape, problem.order, problem.nnz) == (whole.shape, 3, whole.nnz)
    assert problem.value_dtype == np.float32 and not problem.loaded
    comm = get_world()
    problem.plan(comm, 2, "grid_nnz")
    part = problem.take_part(comm)
    assert part["values"].dtype == np.float32 and part["grid"] == [1, 1] and not calls
    np.testing.assert_array_equal(part["indices"], whole.indices)
    with pytest.raises(RuntimeError):
        problem.take_part(comm)
    np.testing.assert_array_equal(problem.indices, whole.indices)
    assert calls == [1] and problem.loaded


def test_tensor_input_needs_a_tensor_operation():
    """A tensor layout declared by a matrix operation stops before anything is read."""
    from hisparse.layout import TensorGridLayout, TensorSliceLayout
    from hisparse.ops import Operation
    cls = type("MatrixParts", (Operation,), {"INPUT_KIND": "matrix"})
    for layout in (TensorGridLayout("grid_nnz", lambda problem: 0),
                   TensorSliceLayout(lambda problem: None)):
        with pytest.raises(TypeError, match=f"{type(layout).__name__} needs INPUT_KIND 'tensor'"):
            layout.load(None, cls.__new__(cls))


# -- SpTV through the driver ----------------------------------------------------------------------

def _by_coords(arrays):
    order = np.lexsort(arrays["coords"].T[::-1])
    return arrays["coords"][order], arrays["values"][order]


@pytest.mark.parametrize("source", ["generated", "file"])
def test_sptv_reads_by_parts_and_gives_one_ranks_result_at_every_rank_count(tmp_path, source):
    """Y at 2 and 4 ranks is Y at one rank, bit for bit (one chunk: no fiber is split), and
    every run verifies against NumPy; each rank's read time and peak host memory are recorded,
    and the whole tensor is loaded for verification only."""
    if source == "file":
        tensor = _awkward_tensor(seed=2)
        _write_raw(tmp_path / "x.h5", tensor)
        given = {"path": str(tmp_path / "x.h5")}
    else:
        given = {"generate": dict(TENSOR_SPECS[0], mode=1)}
    results = {}
    for nprocs in (1, 2, 4):
        config = write_config(tmp_path, "sptv", {"mode": 1, "chunks": 1}, name=f"{nprocs}.yaml",
                              out=f"out{nprocs}", input=given, backend="cpu",
                              run={"repeats": 1, "warmup": 0})
        run, arrays = run_config(tmp_path, config, nprocs=nprocs, out=f"out{nprocs}")
        assert run["attrs"]["verify_passed"] and run["attrs"]["verify_enabled"]
        nnz = np.asarray(run["rank_vars"]["nnz"])
        assert len(nnz) == nprocs and int(nnz.sum()) == run["attrs"]["global_nnz"]
        assert run["attrs"]["sptv_rank_nnz"] == ",".join(str(int(n)) for n in nnz)
        read = run["phases"].index("read")
        assert np.isfinite(run["wall"][0, :, read]).all()
        assert min(run["rank_vars"]["peak_host_bytes_setup"]) > 0
        results[nprocs] = _by_coords(arrays)
    for nprocs in (2, 4):
        np.testing.assert_array_equal(results[nprocs][0], results[1][0])
        np.testing.assert_array_equal(results[nprocs][1], results[1][1])


def test_sptv_by_parts_names_a_bad_file_on_every_rank(tmp_path):
    tensor = _awkward_tensor(seed=3)
    values = tensor.values.copy()
    values[-2] = np.nan
    _write_raw(tmp_path / "bad.h5", COOTensor(tensor.indices, values, tensor.shape))
    config = write_config(tmp_path, "sptv", {"mode": 1}, input={"path": str(tmp_path / "bad.h5")},
                          backend="cpu")
    proc = run_config(tmp_path, config, nprocs=2, expect_rc=2)
    assert f"bad.h5:/: value nan (NaN/Inf) at nonzero {tensor.nnz - 2}" in proc.stderr


# -- the GPU: the same tensor from CuPy -----------------------------------------------------------

@pytest.mark.gpu
def test_the_generator_makes_the_same_tensor_with_cupy():
    """A 1M-nonzero nell-2-like tensor made on the GPU equals NumPy's bit for bit, as do the
    partition's counts taken on the device."""
    import cupy
    from hisparse.gpu import bind_device
    device = bind_device(0)
    try:
        source = generators.tensor_source([12092, 9184, 28818], 1_000_000, 0.14, mode=2, seed=7)
        host_indices, host_values = source.fibers()
        on_device = source.fibers(xp=cupy)
        assert isinstance(on_device[0], cupy.ndarray)
        np.testing.assert_array_equal(on_device[0].get(), host_indices)
        np.testing.assert_array_equal(on_device[1].get(), host_values)
        ids = np.arange(0, 1 << 20, 7)
        for n, seed, stream in ((1 << 21, 3, 1), (111052928, 7, 2), (5, 1, 2)):
            np.testing.assert_array_equal(
                generators.keyed_permutation(cupy.asarray(ids % n), n, seed, stream=stream).get(),
                generators.keyed_permutation(ids % n, n, seed, stream=stream))
        third = range(source.nfibers // 3, 2 * source.nfibers // 3)
        np.testing.assert_array_equal(source.fibers(third, cupy)[0].get(),
                                      source.fibers(third)[0])
        for nparts in (2, 4):
            host = partition_tensor(host_indices, source.shape, 2, nparts)
            device_grid = partition_tensor(on_device[0], source.shape, 2, nparts)
            assert _same_grid(host, device_grid)
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
        device.release()


@pytest.mark.gpu
@pytest.mark.parametrize("dims,nnz,mode,seed,skew", [
    ([30, 20, 40], 20_000, 1, 3, 1.0),      # middle fiber mode
    ([7, 9, 11, 5], 30_000, 0, 5, 2.0),     # order 4, first mode, long skewed fibers
    ([50, 6000], 200_000, 1, 1, 0.5),       # order 2
    ([3, 4, 5], 400, 2, 9, 1.0)])           # fiber space (12) smaller than the fibers asked for
def test_the_device_module_makes_the_numpy_fibers(monkeypatch, dims, nnz, mode, seed, skew):
    """The generator's device kernels (kernels_cu/generators.cu) give NumPy's bits: every fiber
    in one step and in several steps of a few fibers, fibers in any order (as a rank makes the
    fibers it owns), their coordinates, and the keyed permutation of ids past the limit's
    power of two."""
    import cupy
    from hisparse.gpu import bind_device
    device = bind_device(0)
    try:
        source = generators.tensor_source(dims, nnz, 0.14, mode=mode, seed=seed, skew=skew)
        host = source.fibers()
        for step in (1 << 20, 37):
            monkeypatch.setattr(_tensor, "TENSOR_FIBER_STEP_GPU", step)
            made = source.fibers(xp=cupy)
            np.testing.assert_array_equal(made[0].get(), host[0])
            np.testing.assert_array_equal(made[1].get(), host[1])
        ids = np.random.default_rng(seed).permutation(source.nfibers)[:source.nfibers // 2 + 1]
        for got, want in zip(source.fibers_of(cupy.asarray(ids), cupy), source.fibers_of(ids)):
            np.testing.assert_array_equal(got.get(), want)
        np.testing.assert_array_equal(source.fiber_coordinates(cupy.asarray(ids), cupy).get(),
                                      source.fiber_coordinates(ids))
        for n in (2, 3, 1000, (1 << 33) + 5):
            values = np.random.default_rng(n).integers(0, n, size=3000)
            np.testing.assert_array_equal(
                generators.keyed_permutation(cupy.asarray(values), n, seed).get(),
                generators.keyed_permutation(values, n, seed))
    finally:
        cupy.get_default_memory_pool().free_all_blocks()
        device.release()


@pytest.mark.gpu
def test_the_device_generator_loads_no_scipy():
    """Making a tensor's fibers on the GPU loads neither cupyx nor SciPy's sparse package (CuPy
    loads both at its first operation between an array and a scalar: 0.3-0.45 s of a process's
    set-up on the H200 host), in a fresh process."""
    import subprocess
    import sys
    code = ("import sys, cupy; from hisparse import generators; "
            "s = generators.tensor_source([300, 200, 400], 200000, 0.14, mode=2, seed=1); "
            "i, v = s.fibers(xp=cupy); cupy.cuda.Device().synchronize(); "
            "print(len(v) > 0, 'scipy.sparse' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["True", "False"], out.stdout + out.stderr


@pytest.mark.gpu
def test_sptv_gpu_reads_by_parts(tmp_path):
    """Resident SpTV on the GPU with the tensor generated on the device: Y equals the CPU
    backend's (the rank-0 COO never leaves the device) and verifies."""
    spec = dict(TENSOR_SPECS[0], mode=1)
    arrays = {}
    for backend in ("cpu", "gpu"):
        config = write_config(tmp_path, "sptv", {"mode": 1, "chunks": 1, "execution": "resident"},
                              name=f"{backend}.yaml", out=backend, input={"generate": spec},
                              backend=backend, run={"repeats": 1, "warmup": 0})
        run, arrays[backend] = run_config(tmp_path, config, out=backend)
        assert run["attrs"]["verify_passed"]
    cpu, gpu = _by_coords(arrays["cpu"]), _by_coords(arrays["gpu"])
    np.testing.assert_array_equal(gpu[0], cpu[0])
    np.testing.assert_allclose(gpu[1], cpu[1], rtol=1e-13)


@pytest.mark.parametrize("stored", [np.bool_, np.int16, np.float32])
def test_the_whole_read_and_the_slice_read_accept_the_same_values(tmp_path, stored):
    """Boolean (a pattern), integer and floating point values: read_tensor and a rank's slice
    read the same float values; a complex dataset is refused by both, naming the file."""
    indices = np.array([[0, 1], [2, 0], [1, 1]], dtype=np.int64)
    values = np.array([1, 0, 3]).astype(stored)
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = np.array([3, 2], dtype=np.int64)
        handle.create_dataset("indices", data=indices)
        handle.create_dataset("values", data=values)
    whole = read_tensor(str(path), duplicates="reject")
    piece = read_tensor_slice(get_world(), str(path))
    expected = {tuple(i): float(v) for i, v in zip(indices, values)}
    for got in (whole, piece):
        assert got.values.dtype.kind == "f"
        assert {tuple(i): float(v) for i, v in zip(got.indices, got.values)} == expected
    with h5py.File(path, "a") as handle:
        del handle["values"]
        handle.create_dataset("values", data=values.astype(np.complex64))
    for read in (lambda: read_tensor(str(path)), lambda: read_tensor_slice(get_world(), str(path))):
        with pytest.raises(Exception, match=r"t\.h5.*values must be floating point, integer or "
                                            r"boolean"):
            read()


@pytest.mark.parametrize("missing", ["values", "index1"])
def test_the_whole_read_and_the_slice_read_name_a_missing_dataset_alike(tmp_path, missing):
    """A COO group without its values, or with per-mode indices lacking one mode: both readers
    raise the same message, naming the file, the dataset and what the group holds."""
    path = tmp_path / "t.h5"
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = np.array([3, 2], dtype=np.int64)
        handle.create_dataset("index0", data=np.array([0, 2, 1]))
        handle.create_dataset("index1", data=np.array([1, 0, 1]))
        handle.create_dataset("values", data=np.ones(3))
        del handle[missing]
    messages = []
    for read in (lambda: read_tensor(str(path)), lambda: read_tensor_slice(get_world(), str(path))):
        with pytest.raises(Exception) as info:
            read()
        messages.append(str(info.value))
    assert messages[0] == messages[1]
    assert "t.h5" in messages[0] and f"/{missing}' not found (group has: " in messages[0]


def test_routing_goes_gpu_to_gpu_only_for_device_arrays_on_a_device_transport():
    """route_nonzeros takes the device path only with a device transport and every array on the
    GPU in a type the transport carries; host arrays (or host ``positions``), an MPI transport or
    no transport keep the MPI route."""

    class FakeTransport:
        def __init__(self, device, carries=("int64", "float64")):
            self.device, self.types = device, carries

        def carries(self, dtype):
            return np.dtype(dtype).name in self.types

    class DeviceArray(np.ndarray):  # an array whose module reads as CuPy's
        pass

    DeviceArray.__module__ = "cupy._core.core"
    on_device = {"indices": np.zeros((4, 3), np.int64).view(DeviceArray),
                 "values": np.ones(4).view(DeviceArray)}
    routes = _tensor_parts._routes_on_device
    assert routes(FakeTransport(True), on_device)
    assert not routes(FakeTransport(False), on_device)
    assert not routes(None, on_device)
    assert not routes(FakeTransport(True, carries=("int64",)), on_device)  # fp64 not carried
    assert not routes(FakeTransport(True), {**on_device, "positions": np.arange(4)})
    assert not routes(FakeTransport(True), {"indices": np.zeros((4, 3), np.int64),
                                            "values": np.ones(4)})

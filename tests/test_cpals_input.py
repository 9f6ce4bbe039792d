"""CP-ALS reads its tensor by parts (issue 13): every rank reads a slice of the file's nonzeros
(or generates a range of fibers), the row blocks of every mode are cut from counts summed over
the ranks, and each nonzero moves to the owner of its row in every mode.

References: the rank-0 path (the whole tensor read on rank 0, ``CPALS.partition`` and the
scatter), which each rank's part must equal array for array (dtypes and order included); NumPy:
the whole tensor merged with ``np.unique``/``np.add.at``, each mode's blocks sorted by
``np.lexsort``, ||X|| by ``np.linalg.norm``, and the fits of ``numpy_cp_als``.
"""
import functools
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest

from hisparse import generators
from hisparse.config import load_config
from hisparse.context import RunContext
from hisparse.formats import COOTensor
from hisparse.layout import TensorProblem, read_problem, read_tensor_parts
from hisparse.ops.cpals import CPALS
from hisparse.ops.cpals.reference import numpy_cp_als
from hisparse.parallel import CollectiveError, gather_arrays, get_world, node_local
from hisparse.timing import PhaseTimer

from helpers import run_config, write_config

STRATEGIES = ("nnz_balanced", "row_blocks")


def _all(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


def _shared_dir(comm):
    """One temporary directory for every rank (each rank is its own pytest process)."""
    path = tempfile.mkdtemp(prefix="hisparse-cpals-") if comm.rank == 0 else None
    return Path(comm.bcast(path, root=0))


def _write_raw(path, indices, values, shape, per_mode=False, index_dtype=np.int64):
    """A COO group as the schema stores it (duplicates and file order kept)."""
    with h5py.File(path, "w") as handle:
        handle.attrs["format"] = "coo"
        handle.attrs["shape"] = np.asarray(shape, dtype=np.int64)
        if per_mode:
            for m in range(len(shape)):
                handle.create_dataset(f"index{m}", data=indices[:, m].astype(index_dtype))
        else:
            handle.create_dataset("indices", data=indices.astype(index_dtype))
        handle.create_dataset("values", data=values)


def _unsorted_with_duplicates(seed=0):
    """Raw nonzeros of an order-4 tensor in random order with repeated coordinates (some three
    times) and an index of every mode without nonzeros."""
    rng = np.random.default_rng(seed)
    shape = (9, 11, 7, 13)
    nnz = 900
    indices = np.stack([rng.integers(0, s - 1, nnz) for s in shape], axis=1)
    indices[60:120] = indices[120:180]
    indices[180:200] = indices[120:140]
    order = rng.permutation(nnz)
    return indices[order], rng.standard_normal(nnz)[order], shape


def _crowded(seed=1):
    """Mode 0 uses indices 0 and 1 only: at 4 ranks the last blocks of mode 0 hold none."""
    rng = np.random.default_rng(seed)
    shape = (8, 9, 10)
    indices = np.stack([rng.choice([0, 1], size=500, p=[0.45, 0.55]),
                        rng.integers(0, 9, size=500), rng.integers(0, 10, size=500)], axis=1)
    indices = np.unique(indices, axis=0)[::-1].copy()  # distinct, against row-major order
    return indices, rng.uniform(0.1, 1.0, size=len(indices)), shape


GENERATED = {"kind": "random_tensor", "dims": [30, 40, 50], "nnz": 6000, "fibers_per_nnz": 0.15,
             "seed": 2}
GENERATED_4D = {"kind": "random_tensor", "dims": [7, 9, 11, 6], "nnz": 3000,
                "fibers_per_nnz": 0.3, "mode": 1, "seed": 5, "skew": 2.0}


def _inputs(comm):
    """``{name: (input section, NumPy reference of the whole tensor in fp64)}``; files written by
    rank 0 into a directory every rank sees."""
    folder = _shared_dir(comm)
    inputs = {}
    for name, spec in (("generated", GENERATED), ("generated 4-D", GENERATED_4D)):
        whole = generators.generate(spec)
        inputs[name] = ({"generate": spec}, whole.indices, whole.values, whole.shape)
    for name, (indices, values, shape), per_mode in (
            ("file with duplicates", _unsorted_with_duplicates(), False),
            ("file, per-mode int32", _unsorted_with_duplicates(seed=3), True),
            ("file, crowded mode 0", _crowded(), False)):
        path = folder / f"{name.replace(' ', '_').replace(',', '')}.h5"
        if comm.rank == 0:
            _write_raw(path, indices, values, shape, per_mode=per_mode,
                       index_dtype=np.int32 if per_mode else np.int64)
        # The reference merge: distinct coordinates sorted row-major, copies summed in file order.
        merged, inverse = np.unique(indices, axis=0, return_inverse=True)
        sums = np.zeros(len(merged))
        np.add.at(sums, inverse.ravel(), values)
        inputs[name] = ({"path": str(path)}, merged, sums, shape)
    comm.Barrier()
    return inputs


def _context(config, comm, local_comm, backend, device=None):
    return RunContext(config=config, comm=comm, local_comm=local_comm, backend=backend,
                      timer=PhaseTimer(CPALS.phases()), device=device)


def _both_paths(config_path, comm, local_comm, backend):
    """``((part, start) of the rank-0 path, (part, start) read by parts, the TensorProblem)``;
    ``backend`` "gpu" takes the GPU engines' parts (the blocks' nonzeros, unsorted): making
    them touches no device."""
    config = load_config(str(config_path))
    whole_op = CPALS(_context(config, comm, local_comm, backend))
    whole = read_problem(config, CPALS) if comm.rank == 0 else None
    rank0 = whole_op.distribute(whole)
    parts_op = CPALS(_context(config, comm, local_comm, backend))
    assert parts_op.reads_tensor_parts()
    problem = read_tensor_parts(comm, config, CPALS)
    assert isinstance(problem, TensorProblem)
    return rank0, parts_op.distribute(problem), problem


def _identical(a, b):
    """Same keys, and per key the same array (dtype, shape, every bit) or the same scalar."""
    if set(a) != set(b):
        return False
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not (isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and
                    x.dtype == y.dtype and x.shape == y.shape and
                    np.array_equal(x, y, equal_nan=x.dtype.kind == "f")):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def _blocks_against_numpy(comm, part, whole_indices, whole_values, shape, backend, dtype,
                          nnz_blocks):
    """Rank 0: the ranks' blocks of every mode tile its rows and hold exactly the NumPy
    tensor's nonzeros (CPU: sorted by the mode's index, then the other modes); ||X|| is
    NumPy's. ``nnz_blocks`` collects each mode's nonzeros per rank."""
    order = len(shape)
    mine = {key: value for key, value in part.items() if isinstance(value, np.ndarray)}
    scalars = {key: value for key, value in part.items() if not isinstance(value, np.ndarray)}
    gathered = gather_arrays(comm, dict(mine, **{k: np.asarray(v) for k, v in scalars.items()
                                                if k.endswith(("n_rows", "row_offset"))}))
    if comm.rank != 0:
        return True
    ok = np.isclose(part["norm_x"], np.linalg.norm(whole_values.astype(dtype).astype(np.float64)),
                    rtol=1e-12)
    for n in range(order):
        others = [m for m in range(order) if m != n]
        coords, values, start = [], [], 0
        for got in gathered:
            offset = int(np.ravel(got[f"mode{n}_row_offset"])[0])
            rows = int(np.ravel(got[f"mode{n}_n_rows"])[0])
            ok = ok and offset == start
            start += rows
            if backend == "cpu":
                indptr = got[f"mode{n}_indptr"].astype(np.int64)
                block = np.empty((indptr[-1], order), dtype=np.int64)
                block[:, n] = offset + np.repeat(np.arange(rows), np.diff(indptr))
                block[:, others] = got[f"mode{n}_other_idx"].T
            else:
                block = got[f"mode{n}_indices"]
            ok = ok and bool(np.all((block[:, n] >= offset) & (block[:, n] < offset + rows)))
            coords.append(block)
            values.append(got[f"mode{n}_values"])
            nnz_blocks.setdefault(n, []).append(len(block))
        ok = ok and start == shape[n]
        coords, values = np.concatenate(coords), np.concatenate(values)
        # The NumPy tensor in the order the blocks should hold it: by the mode's index, then
        # the other modes (a CPU block's CSR; a GPU block's nonzeros are compared as a set).
        want = np.lexsort([whole_indices[:, m] for m in reversed(others)] +
                          [whole_indices[:, n]])
        if backend != "cpu":
            have = np.lexsort([coords[:, m] for m in reversed(others)] + [coords[:, n]])
            coords, values = coords[have], values[have]
        ok = ok and np.array_equal(coords, whole_indices[want])
        # Sums of copies may differ in the last bit from np.add.at's order (NumPy's reduceat
        # adds a run's first value to the pairwise sum of the rest); the rank-0 path's bits
        # are checked by _identical.
        ok = ok and values.dtype == dtype and np.allclose(
            values, whole_values[want].astype(dtype), rtol=1e-12 if dtype == np.float64 else 1e-6,
            atol=0)
    return ok


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_parts_read_by_rank_equal_the_rank0_partition(nprocs, tmp_path):
    """Generated and file inputs (unsorted, duplicates, per-mode int32 indices, blocks without
    nonzeros), both strategies, fp32/fp64, int32/int64 index widths, both backends' parts."""
    comm = get_world()
    local_comm = node_local(comm)
    ok, empty_blocks = True, 0
    for name, (section, indices, values, shape) in _inputs(comm).items():
        for strategy in STRATEGIES:
            for precision, dtype in (("fp64", np.float64), ("fp32", np.float32)):
                for width in ("int32", "int64"):
                    for backend in ("cpu", "gpu"):
                        config = write_config(
                            tmp_path, "cpals", {"rank": 3}, name="c.yaml", input=section,
                            backend="cpu", precision=precision, index_width=width,
                            partition={"strategy": strategy})
                        (part0, start0), (part, start), problem = _both_paths(
                            config, comm, local_comm, backend)
                        same = _identical(part, part0) and _identical(start, start0)
                        if not same:
                            print(f"rank {comm.rank}: {name} {strategy} {precision} {width} "
                                  f"{backend} differs")
                        ok = ok and same and problem.nnz == len(values)
                        ok = ok and not problem.loaded  # the whole tensor was never made
                        per_rank = {}
                        ok = ok and _blocks_against_numpy(comm, part, indices, values, shape,
                                                          backend, dtype, per_rank)
                        if comm.rank == 0:
                            empty_blocks += sum(c == 0 for counts in per_rank.values()
                                                for c in counts)
    assert _all(comm, ok)
    if comm.size == 4 and comm.rank == 0:
        assert empty_blocks > 0  # the crowded tensor left blocks without nonzeros


def _fits(config_path, comm, local_comm, by_parts, backend="cpu", xp=np):
    """One CP-ALS repetition in this process from the rank-0 path or read by parts (a generated
    tensor made with ``xp``, or with the operation's ``input_module()`` for ``xp=None``): the
    fits, the result (rank 0; else None), the op and the problem."""
    config = load_config(str(config_path))
    device = None
    if backend == "gpu":
        from hisparse.gpu import bind_device
        device = bind_device(local_comm.rank)
    op = CPALS(_context(config, comm, local_comm, backend, device))
    if by_parts:
        problem = read_tensor_parts(comm, config, CPALS, op.input_module() if xp is None else xp)
    else:
        problem = read_problem(config, CPALS) if comm.rank == 0 else None
    try:
        op.setup(problem)
        op.run_once()
        op.collect()
        return np.asarray(op.fits), (op.result() if comm.rank == 0 else None), op, problem
    finally:
        op.teardown()
        if device is not None:
            device.release()


def _same_runs(comm, tmp_path, backend, same=np.array_equal):
    """Whole runs read by parts and on the rank-0 path: the same fits, lambda and factors
    (``same``: bit for bit by default), and NumPy's fits from the same start."""
    local_comm = node_local(comm)
    inputs = _inputs(comm)
    ok = True
    for name in ("generated", "file with duplicates", "file, crowded mode 0"):
        section, indices, values, shape = inputs[name]
        for strategy in STRATEGIES:
            config = write_config(tmp_path, "cpals", {"rank": 3, "tol": 0.0, "max_iters": 6},
                                  name="c.yaml", input=section, backend="cpu",
                                  partition={"strategy": strategy})
            fits0, result0, _, _ = _fits(config, comm, local_comm, False, backend)
            fits, result, op, problem = _fits(config, comm, local_comm, True, backend)
            ok = ok and fits.shape == (6,) and same(fits, fits0)
            if comm.rank == 0:
                ok = ok and same(result["lambda"], result0["lambda"])
                ok = ok and all(same(a, b) for a, b in zip(result["factors"], result0["factors"]))
                # NumPy's CP-ALS from the same start, on the NumPy tensor.
                reference = numpy_cp_als(COOTensor(indices, values, shape),
                                         op.initial["factors"], 3, 0.0, 6)
                ok = ok and np.allclose(fits, reference["fits"], rtol=0, atol=1e-9)
                ok = ok and not problem.loaded
    return ok


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_whole_runs_give_the_rank0_paths_fits_bit_for_bit(nprocs, tmp_path):
    comm = get_world()
    assert _all(comm, _same_runs(comm, tmp_path, "cpu"))


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[1, 2])
def test_gpu_runs_read_by_parts_give_the_rank0_paths_fits_bit_for_bit(nprocs, tmp_path):
    """The GPU engines get the same nonzeros (the parts test checks them bit for bit) and sort
    them on their devices (MPI transport). The 'fast' MTTKRP adds rows cut by its chunks with
    atomics, so two runs on the same input may differ in the last bits: compared to 1e-12."""
    comm = get_world()
    close = functools.partial(np.allclose, rtol=1e-12, atol=1e-14)
    assert _all(comm, _same_runs(comm, tmp_path, "gpu", close))


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[1, 2])
@pytest.mark.parametrize("precision", ["fp64", "fp32"])  # apart: pytest -n spreads them
def test_gpu_parts_generated_on_the_device_equal_the_host_generated_ones(nprocs, precision,
                                                                        tmp_path):
    """The GPU backend generates its slice with CuPy (``input_module``) and counts, casts and
    routes it on the device: every part, downloaded, equals the part of the slice generated by
    NumPy array for array (dtypes and order), the blocks' nonzeros still on the device."""
    cupy = pytest.importorskip("cupy")
    comm = get_world()
    local_comm = node_local(comm)
    ok = True
    for name, spec in (("generated", GENERATED), ("generated 4-D", GENERATED_4D)):
        for strategy in STRATEGIES:
            for width in ("int32", "int64"):
                config = load_config(str(write_config(
                    tmp_path, "cpals", {"rank": 3}, name="c.yaml", input={"generate": spec},
                    backend="gpu", precision=precision, index_width=width,
                    partition={"strategy": strategy})))
                host_op = CPALS(_context(config, comm, local_comm, "gpu"))
                part0, start0 = host_op.distribute(read_tensor_parts(comm, config, CPALS))
                device_op = CPALS(_context(config, comm, local_comm, "gpu"))
                xp = device_op.input_module()
                ok = ok and xp is cupy
                part, start = device_op.distribute(read_tensor_parts(comm, config, CPALS, xp))
                on_device = [key for key, value in part.items()
                             if isinstance(value, cupy.ndarray)]
                ok = ok and sorted(on_device) == sorted(
                    f"mode{n}_{what}" for n in range(len(spec["dims"]))
                    for what in ("indices", "values"))
                downloaded = {key: value.get() if key in on_device else value
                              for key, value in part.items()}
                same = _identical(downloaded, part0) and _identical(start, start0)
                if not same:
                    print(f"rank {comm.rank}: {name} {strategy} {precision} {width} differs")
                ok = ok and same
    assert _all(comm, ok)


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[1, 2])
def test_gpu_runs_on_a_tensor_generated_on_the_device_give_the_host_generated_fits(nprocs,
                                                                                   tmp_path):
    """Whole GPU runs on the tensor generated with CuPy and sorted where it was made equal those
    on the tensor generated by NumPy and uploaded: bit for bit with the 'seed' MTTKRP (no
    atomics), to 1e-12 with 'fast' (rows cut by its chunks are added atomically); the
    unfoldings were sorted on the device and the whole tensor was never made."""
    pytest.importorskip("cupy")
    comm = get_world()
    local_comm = node_local(comm)
    close = functools.partial(np.allclose, rtol=1e-12, atol=1e-14)
    ok = True
    for kernel, same in (("seed", np.array_equal), ("fast", close)):
        for name, spec in (("generated", GENERATED), ("generated 4-D", GENERATED_4D)):
            config = write_config(tmp_path, "cpals", {"rank": 3, "tol": 0.0, "max_iters": 6,
                                                      "mttkrp": kernel},
                                  name="c.yaml", input={"generate": spec}, backend="gpu")
            fits0, result0, _, _ = _fits(config, comm, local_comm, True, "gpu")
            fits, result, op, problem = _fits(config, comm, local_comm, True, "gpu", xp=None)
            ok = ok and op.engine.unfoldings_built_on == "device" and not problem.loaded
            ok = ok and fits.shape == (6,) and same(fits, fits0)
            if comm.rank == 0:
                ok = ok and same(result["lambda"], result0["lambda"])
                ok = ok and all(same(a, b) for a, b in zip(result["factors"], result0["factors"]))
            if not ok:
                print(f"rank {comm.rank}: {kernel} {name}: {fits} != {fits0}")
    assert _all(comm, ok)


def test_the_cpu_backend_generates_its_slice_with_numpy(tmp_path):
    """Only the GPU backend sorts its unfoldings on a device; the CPU backend's slice is made
    by NumPy (its CSR is built with NumPy)."""
    comm = get_world()
    config = load_config(str(write_config(tmp_path, "cpals", {"rank": 2},
                                          input={"generate": GENERATED}, backend="cpu")))
    assert CPALS(_context(config, comm, node_local(comm), "cpu")).input_module() is np


def test_runs_that_need_the_whole_tensor_on_rank0_keep_the_rank0_path(tmp_path):
    """nvecs and checkpoints need the whole tensor on rank 0 before the ALS: read there."""
    spec = {"generate": GENERATED}
    cases = {"random": ({}, True), "file init": ({"init": str(tmp_path / "f.h5")}, True),
             "nvecs": ({"init": "nvecs"}, False),
             "checkpoints": ({"checkpoint_every": 2, "checkpoint": str(tmp_path / "c.h5")},
                             False),
             "resume": ({"resume": True, "checkpoint": str(tmp_path / "c.h5")}, False)}
    comm = get_world()
    for name, (params, by_parts) in cases.items():
        config = load_config(str(write_config(tmp_path, "cpals", dict(params, rank=2),
                                              input=spec, backend="cpu")))
        op = CPALS(_context(config, comm, node_local(comm), "cpu"))
        assert op.reads_tensor_parts() == by_parts, name


@pytest.mark.parametrize("nprocs", [2, 4])
def test_driver_run_by_parts_verifies_and_records_setup(tmp_path, nprocs):
    """Through ``hisparse run``: the fits verify against NumPy, every rank records its read
    and setup phases and its peak host memory, and rank 0 holds a block like the others."""
    indices, values, shape = _unsorted_with_duplicates(seed=5)
    _write_raw(tmp_path / "x.h5", indices, values, shape)
    config = write_config(tmp_path, "cpals", {"rank": 3, "tol": 1e-6, "max_iters": 30},
                          input={"path": str(tmp_path / "x.h5")}, backend="cpu",
                          run={"repeats": 1, "warmup": 0})
    run, arrays = run_config(tmp_path, config, nprocs=nprocs)
    assert run["attrs"]["verify_passed"] and run["attrs"]["verify_enabled"]
    merged = len(np.unique(indices, axis=0))
    nnz = np.asarray(run["rank_vars"]["nnz"])
    assert len(nnz) == nprocs and int(nnz.sum()) == len(shape) * merged
    assert int(nnz.max()) < len(shape) * merged  # no rank holds every nonzero
    for phase in ("read", "partition", "distribute"):
        column = run["phases"].index(phase)
        assert np.isfinite(run["wall"][0, :, column]).all()
    assert min(run["rank_vars"]["peak_host_bytes_setup"]) > 0
    assert len(arrays["fit"]) >= 2


@pytest.mark.parallel(nprocs=[2])
def test_bad_input_by_parts_stops_every_rank_naming_it(nprocs, tmp_path):
    """A NaN read by the last rank, a rejected duplicate, a mode shorter than the ranks and an
    empty tensor: one error on every rank, naming the file (and the nonzero)."""
    comm = get_world()
    local_comm = node_local(comm)
    folder = _shared_dir(comm)
    indices, values, shape = _unsorted_with_duplicates(seed=7)
    bad = values.copy()
    bad[-2] = np.nan
    if comm.rank == 0:
        _write_raw(folder / "nan.h5", indices, bad, shape)
        _write_raw(folder / "dup.h5", indices, values, shape)
        _write_raw(folder / "thin.h5", indices[:, :3] % [9, 1, 7], values[:], (9, 1, 7))
        _write_raw(folder / "empty.h5", np.zeros((0, 3), dtype=np.int64), np.zeros(0),
                   (4, 5, 6))
    comm.Barrier()
    cases = {"nan.h5": ({}, rf"value nan \(NaN/Inf\) at nonzero {len(values) - 2}"),
             "dup.h5": ({"duplicates": "reject"}, r"duplicate coordinates \(.*\) \(nonzero "),
             "thin.h5": ({}, r"mode 1 \(length 1\) has fewer than the 2 ranks"),
             "empty.h5": ({}, "the tensor has no nonzeros")}
    for file, (extra, message) in cases.items():
        config = load_config(str(write_config(
            tmp_path, "cpals", {"rank": 2}, input=dict({"path": str(folder / file)}, **extra),
            backend="cpu")))
        op = CPALS(_context(config, comm, local_comm, "cpu"))
        with pytest.raises(CollectiveError, match=f"{file}.*{message}"):
            op.distribute(read_tensor_parts(comm, config, CPALS))

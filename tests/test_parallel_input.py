"""Rank-parallel input (issue 13): every rank reads or generates only its rows, and gets exactly
what the rank-0 path (read the whole matrix, partition it, scatter) gives it.

References: the whole matrix read by :func:`hisparse.io.read_matrix` (SciPy canonicalises it)
and cut by :func:`hisparse.partition.partition_rows`; the whole-matrix generators; and, through
the driver, the same tiny operation run with ``WholeOnRoot`` (the rank-0 path) and ``RowLayout``, checked
against SciPy by the driver's verification.
"""
import itertools
import sys
import tempfile
import types
import zlib
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.generators import _random_matrix, _registry, _rmat
from hisparse.formats import CSRMatrix, index_dtype_for
from hisparse.io import read_matrix, write_matrix
from hisparse.io import _hyperslab
from hisparse.arrays import repeated_value
from hisparse.layout import cast_row_part, generate_row_part, read_row_part
from hisparse.parallel import CollectiveError, gather_arrays, get_world
from hisparse.partition import ROW_STRATEGIES, partition_rows

from helpers import read_run, write_config


def _all(comm, ok):
    from mpi4py import MPI
    return comm.allreduce(bool(ok), op=MPI.LAND)


def _shared_dir(comm):
    """One temporary directory for every rank (each rank is its own pytest process)."""
    path = tempfile.mkdtemp(prefix="hisparse-rows-") if comm.rank == 0 else None
    return Path(comm.bcast(path, root=0))


def _rank0_part(whole, strategy, comm):
    """What the rank-0 path gives this rank: SpMV/SpGEMM's ``partition()`` per-rank dict."""
    plan = partition_rows(whole.indptr, comm.size, strategy)
    rows = plan.rows[comm.rank]
    block = (whole.row_block(int(rows[0]), int(rows[-1]) + 1) if plan.contiguous
             else whole.rows(rows))
    return {"indptr": block.indptr.astype(whole.indptr.dtype), "indices": block.indices,
            "data": block.data, "rows": rows, "ncols": whole.ncols, "nrows": whole.nrows}


def _same_part(got, want, dtypes=True):
    """Equal arrays (of equal dtypes), equal scalars, the same keys."""
    if set(got) != set(want):
        return False
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            if (dtypes and got[key].dtype != value.dtype) or not np.array_equal(got[key], value):
                return False
        elif got[key] != value:
            return False
    return True


def _awkward_matrix(index_dtype, seed=0):
    """Empty rows (a run of them and the last row), one long row, unsorted columns and duplicate
    entries, in the index dtype of the file."""
    rng = np.random.default_rng(seed)
    m, n = 157, 120
    lengths = rng.integers(0, 7, m)
    lengths[20:45] = 0
    lengths[-1] = 0
    lengths[90] = 400  # longer than a read chunk, with repeated columns
    rows = np.repeat(np.arange(m), lengths)
    cols = rng.integers(0, n, len(rows))
    values = rng.standard_normal(len(rows))
    order = np.lexsort((rng.random(len(rows)), rows))  # rows ascending, columns shuffled
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    return CSRMatrix(indptr.astype(index_dtype), cols[order].astype(index_dtype), values[order],
                     (m, n))


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_parts_read_by_rank_equal_the_rank0_partition(nprocs, monkeypatch):
    comm = get_world()
    # Small chunks: the indptr scan and the row_modulo reads take many steps.
    monkeypatch.setattr(_hyperslab, "INDPTR_CHUNK", 13)
    monkeypatch.setattr(_hyperslab, "ENTRY_CHUNK", 37)
    folder = _shared_dir(comm)
    files = {}
    for name, dtype in (("int32", np.int32), ("int64", np.int64)):
        files[name] = folder / f"{name}.h5"
        if comm.rank == 0:
            write_matrix(files[name], _awkward_matrix(dtype), group="/A", mode="w")
    comm.Barrier()
    ok = True
    for name, path in files.items():
        whole = read_matrix(path, "/A")
        for strategy in ROW_STRATEGIES:
            part = read_row_part(comm, str(path), "/A", strategy)
            assert part.nnz == whole.nnz and part.shape == whole.shape
            raw = _same_part(part.arrays(), _rank0_part(whole, strategy, comm), dtypes=False)
            for precision, value_dtype in (("fp64", np.float64), ("fp32", np.float32)):
                for width in ("auto", "int64"):
                    index = index_dtype_for(max(whole.nnz, *whole.shape), width)
                    cast = cast_row_part(comm, part, value_dtype, width, str(path), precision)
                    want = _rank0_part(whole.astype(value_dtype, index), strategy, comm)
                    ok = ok and raw and _same_part(cast.arrays(), want)
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2, 4])
def test_a_bad_part_stops_every_rank_naming_the_file(nprocs):
    comm = get_world()
    folder = _shared_dir(comm)
    good = _awkward_matrix(np.int64)
    last_row = good.nrows - 2  # owned by the last rank under every strategy
    start = int(good.indptr[last_row])
    cases = {}
    data = good.data.copy()
    data[start] = np.nan
    cases["nan"] = (data, good.indices, rf"nan.h5:/: value nan \(NaN/Inf\) at entry {start} "
                                        rf"\(row {last_row}, ")
    indices = good.indices.copy()
    indices[start] = good.ncols
    cases["column"] = (good.data, indices, rf"column index {good.ncols} out of range "
                                           rf"\[0, {good.ncols}\) at entry {start} "
                                           rf"\(row {last_row}\)")
    for name, (values, columns, _) in cases.items():
        if comm.rank == 0:
            write_matrix(folder / f"{name}.h5", CSRMatrix(good.indptr, columns, values,
                                                          good.shape), mode="w")
    comm.Barrier()
    for name, (_, _, message) in cases.items():
        for strategy in ROW_STRATEGIES:
            with pytest.raises(CollectiveError, match=message):
                read_row_part(comm, str(folder / f"{name}.h5"), "/", strategy)
    # Duplicates (row 90 has them): summed by default, rejected on request, naming the row.
    if comm.rank == 0:
        write_matrix(folder / "dup.h5", good, mode="w")
    comm.Barrier()
    with pytest.raises(CollectiveError, match=r"dup.h5: duplicate entries in row \d+"):
        read_row_part(comm, str(folder / "dup.h5"), "/", "row_modulo", duplicates="reject")
    with pytest.raises(CollectiveError, match="more ranks"):
        generate_row_part(comm, {"kind": "trefethen", "n": nprocs - 1}, "row_blocks")


# -- generators by part ---------------------------------------------------------------------------

GENERATOR_SPECS = [
    {"kind": "poisson", "dims": [9, 7], "stencil": 9, "scale": 0.5},
    {"kind": "poisson", "dims": [5, 4, 6], "stencil": 27},
    {"kind": "poisson", "dims": [6, 5, 4], "stencil": 7},
    {"kind": "trefethen", "n": 77},
    {"kind": "rmat", "scale": 10, "edge_factor": 6, "seed": 3},
    {"kind": "rmat", "scale": 9, "edge_factor": 8, "seed": 4, "symmetric": True,
     "a": 0.45, "b": 0.25, "c": 0.15},
    {"kind": "random_matrix", "rows": 3000, "cols": 500, "nnz_per_row": 5, "seed": 5},
    {"kind": "random_matrix", "rows": 2500, "nnz_per_row": 9, "power_law": 1.2, "seed": 6},
]


def _assemble(pieces, shape):
    """The global matrix from every rank's rows, as SciPy CSR."""
    rows = np.concatenate([p["rows"] for p in pieces])
    lengths = np.concatenate([np.diff(p["indptr"]) for p in pieces])
    row_ids = np.repeat(rows, lengths)
    return sp.csr_matrix((np.concatenate([p["data"] for p in pieces]),
                          (row_ids, np.concatenate([p["indices"] for p in pieces]))),
                         shape=shape)


def _identical(a, b):
    a, b = a.tocsr(), b.tocsr()
    return (a.shape == b.shape and np.array_equal(a.indptr, b.indptr) and
            np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_generators_by_part_make_the_whole_generators_matrix(nprocs, monkeypatch):
    comm = get_world()
    # Small blocks, so that every rank makes some and the routing matters.
    monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", 1000)
    # read where the blocks are made and by the registry's part source (rows_per_block)
    monkeypatch.setattr(_random_matrix, "RANDOM_ROW_BLOCK", 128)
    monkeypatch.setattr(_registry, "RANDOM_ROW_BLOCK", 128)
    ok = True
    for spec in GENERATOR_SPECS:
        whole = generators.generate(spec)
        for strategy in ROW_STRATEGIES:
            part = generate_row_part(comm, spec, strategy)
            ok = ok and part.nnz == whole.nnz and part.symmetric == whole.symmetric
            # Each rank: exactly the rank-0 partition's part of the whole matrix.
            ok = ok and _same_part(part.arrays(), _rank0_part(whole, strategy, comm),
                                   dtypes=False)
            # Together: the whole generator's matrix.
            pieces = gather_arrays(comm, part.arrays())
            if comm.rank == 0:
                ok = ok and _identical(_assemble(pieces, whole.shape), whole.to_scipy())
    assert _all(comm, ok)


@pytest.mark.gpu
@pytest.mark.parallel(nprocs=[1, 2])
def test_rmat_part_made_on_the_gpu_is_the_hosts(nprocs, tmp_path, monkeypatch):
    """A GPU run's ranks make their R-MAT edges on their GPUs (the threshold lowered so that a
    small graph does): every rank's part is the one the host makes, for every row strategy."""
    from helpers import gpu_bound, run_context
    from hisparse.parallel import node_local
    comm = get_world()
    monkeypatch.setattr(_rmat, "DEVICE_EDGES_MIN", 0)
    monkeypatch.setattr(_rmat, "RMAT_EDGE_BLOCK", 1000)
    spec = {"kind": "rmat", "scale": 10, "edge_factor": 8, "seed": 2, "symmetric": True}
    ok = True
    with gpu_bound(node_local(comm).rank) as device:
        ctx = run_context(tmp_path, "spmv", backend="gpu", device=device, comm=comm,
                          input={"generate": spec})
        for strategy in ROW_STRATEGIES:
            host = generate_row_part(comm, spec, strategy)
            made = generate_row_part(comm, spec, strategy, device=ctx)
            ok = ok and made.nnz == host.nnz and _same_part(made.arrays(), host.arrays())
            # the contiguous strategies take the whole matrix made on every GPU
            ok = ok and made.on_device == (strategy != "row_modulo") and not host.on_device
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[1, 2, 3])
@pytest.mark.parametrize("refusing_rank", [None, 0, 1])
def test_whole_rows_made_by_every_rank_give_the_hosts_parts(nprocs, refusing_rank, monkeypatch):
    """Where every rank can make the whole R-MAT matrix's rows (a GPU run: the rows stand in
    for the device's, the host's whole matrix as its device would make it), each keeps the
    part the host's edges-and-moves path gives it, for the contiguous strategies; where one
    rank cannot (``refusing_rank``), every rank takes the host's path (and none makes the whole
    rows), and row_modulo always does. Given the run's index width, the rows made whole come
    in its dtypes (int32 here) and equal the host's part cast to them."""
    comm = get_world()
    made = []

    class RowsFromHost(generators.RmatRowsOnDevice):
        def fits(self):
            return comm.rank != refusing_rank

        def make(self):
            made.append(True)
            whole = generators.rmat(**self.params)
            return np.asarray(whole.indptr, dtype=np.int64), whole.indices

        @staticmethod
        def download(columns, first, last, dtype=np.int64):
            return np.asarray(columns[first:last], dtype=dtype)

        @staticmethod
        def release():
            pass

    def took_whole_rows(strategy):
        return strategy != "row_modulo" and (refusing_rank is None or refusing_rank >= nprocs)

    spec = {"kind": "rmat", "scale": 9, "edge_factor": 6, "seed": 4, "symmetric": True}
    ok = True
    hosts = {strategy: generate_row_part(comm, spec, strategy) for strategy in ROW_STRATEGIES}
    monkeypatch.setattr(_registry, "RmatRowsOnDevice", RowsFromHost)
    monkeypatch.setattr(_rmat, "DEVICE_EDGES_MIN", 0)
    device = object()  # a GPU run's context; the host's edges below (nothing touches it)
    monkeypatch.setattr(_registry, "rmat_part_edges",
                        lambda params, blocks, device=None: generators.rmat_edges(
                            **params, blocks=blocks))
    for strategy, width, repeated in itertools.product(ROW_STRATEGIES, (None, "auto"),
                                                       (False, True)):
        made.clear()
        part = generate_row_part(comm, spec, strategy, device=device, index_width=width,
                                 repeated_values=repeated)
        want = hosts[strategy]
        # asked for, the unit values of rows made whole come as one value repeated (no memory)
        ok = ok and (repeated_value(part.data) is not None) == (
            repeated and took_whole_rows(strategy) and part.data.size > 1)
        if width is not None:  # in the run's dtypes at once where made whole (int32 here)
            want = cast_row_part(comm, want, np.float32, width, "test", "fp32")
            if took_whole_rows(strategy):
                ok = ok and part.indices.dtype == np.int32 and part.indptr.dtype == np.int32
            was_repeated = repeated_value(part.data) is not None
            part = cast_row_part(comm, part, np.float32, width, "test", "fp32")
            ok = ok and part.data.dtype == np.float32 and \
                (repeated_value(part.data) is not None) == was_repeated
        ok = ok and part.nnz == want.nnz and _same_part(part.arrays(), want.arrays())
        ok = ok and bool(made) == took_whole_rows(strategy) == part.on_device
        bounds = hosts[strategy].bounds
        ok = ok and (part.bounds is None if bounds is None else
                     np.array_equal(part.bounds, bounds))
    assert _all(comm, ok)


# -- the driver: a tiny operation, read whole on rank 0 and by rows -------------------------------

def _row_sums_class(row_input):
    """y = A x with x from run.seed, rows gathered to rank 0 every repeat; records a checksum of
    its part and whether rank 0 loaded the whole matrix."""
    from hisparse.layout import RowLayout
    from hisparse.ops import Operation
    from hisparse.parallel import RowGather

    class RowSums(Operation):
        NAME = "rowsums_rows" if row_input else "rowsums_root"
        if row_input:
            def layout(self):
                return RowLayout(self.strategy)
        PARTITIONS = ROW_STRATEGIES
        SETUP_PHASES = {"partition": "setup", "distribute": "communication"}
        REPEAT_PHASES = {"kernel": "compute", "gather": "communication"}
        loaded = None

        def _x(self, n):
            return np.random.default_rng(self.ctx.config["run.seed"]).uniform(-1, 1, n)

        def setup(self, problem):
            self.problem = problem
            self.part, shared = self.distribute(problem)
            self.x = shared["x"]
            self.gather = RowGather(self.ctx.comm, self.part["rows"], self.part["nrows"])

        def partition(self, problem):  # the rank-0 path, as SpMV's
            parts = [_rank0_part(problem, self.strategy, types.SimpleNamespace(
                size=self.ctx.size, rank=r)) for r in range(self.ctx.size)]
            return parts, {"x": self._x(problem.ncols)}

        def shared_data(self, part):
            return {"x": self._x(part["ncols"])}

        def run_once(self):
            p = self.part
            with self.ctx.timer.phase("kernel"):
                local = sp.csr_matrix((p["data"], p["indices"], p["indptr"]),
                                      shape=(len(p["rows"]), p["ncols"])) @ self.x
            with self.ctx.timer.phase("gather"):
                self.y = self.gather(local)

        def result(self):
            return self.y

        def result_arrays(self, result):
            return {"y": result}

        def reference(self, problem):
            return problem.to_scipy() @ self.x

        def rank_info(self):
            digest = 0
            for key in ("indptr", "indices", "data", "rows"):
                array = np.ascontiguousarray(self.part[key])
                digest = zlib.crc32(array.dtype.str.encode() + array.tobytes(), digest)
            return {"part_crc": int(digest), "part_nnz": int(self.part["indptr"][-1]),
                    "part_index_dtype": str(self.part["indices"].dtype)}

        def teardown(self):
            type(self).loaded = getattr(self.problem, "loaded", True)

    return RowSums


@pytest.fixture
def row_sums_ops(monkeypatch):
    from hisparse import ops
    classes = {}
    for row_input in (False, True):
        cls = _row_sums_class(row_input)
        module = types.ModuleType(f"hisparse_test_{cls.NAME}")
        module.OPERATION = cls
        monkeypatch.setitem(sys.modules, module.__name__, module)
        monkeypatch.setitem(ops.OPERATIONS, cls.NAME, module.__name__)
        classes[row_input] = cls
    return classes


def _config_once(comm, folder, *args, **kwargs):
    """Rank 0 writes the config (ranks writing one file at once could tear it); every rank gets
    its path."""
    path = str(write_config(folder, *args, **kwargs)) if comm.rank == 0 else None
    return comm.bcast(path, root=0)


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_an_operation_reading_rows_gets_what_the_rank0_path_gives(nprocs, row_sums_ops):
    from hisparse.driver import run
    comm = get_world()
    folder = _shared_dir(comm)
    matrix_file = folder / "a.h5"
    if comm.rank == 0:
        write_matrix(matrix_file, _awkward_matrix(np.int32, seed=1), group="/A", mode="w")
    comm.Barrier()
    inputs = {"file": {"path": str(matrix_file), "group": "/A"},
              "generated": {"generate": {"kind": "rmat", "scale": 9, "edge_factor": 8,
                                         "seed": 2}}}
    ok = True
    for label, source in inputs.items():
        for strategy in ROW_STRATEGIES:
            runs = {}
            for row_input, cls in row_sums_ops.items():
                name = f"{label}-{strategy}-{cls.NAME}"
                config = _config_once(comm, folder, cls.NAME, name=f"{name}.yaml", out=name,
                                      input=source, backend="cpu", precision="fp32",
                                      partition={"strategy": strategy},
                                      run={"repeats": 1, "warmup": 0, "progress": False})
                path = run(config, comm=comm)
                if comm.rank == 0:
                    runs[row_input] = read_run(path)
                    ok = ok and cls.loaded  # verification read the whole matrix
            if comm.rank == 0:
                (rank0, rank0_y), (rows, rows_y) = runs[False], runs[True]
                ok = ok and rows["attrs"]["verify_passed"] and rank0["attrs"]["verify_passed"]
                ok = ok and np.array_equal(rows_y["y"], rank0_y["y"])
                for key in ("part_crc", "part_nnz", "part_index_dtype"):
                    ok = ok and list(rows["rank_vars"][key]) == list(rank0["rank_vars"][key])
                for key in ("global_rows", "global_cols", "global_nnz", "index_dtype",
                            "value_dtype"):
                    ok = ok and rows["attrs"][key] == rank0["attrs"][key]
                ok = ok and not rows["attrs"]["input_made_on_device"]  # a CPU run's rows
                peaks = rows["rank_vars"]["peak_host_bytes"]
                ok = ok and len(peaks) == nprocs and min(peaks) > 0
                ok = ok and min(rows["rank_vars"]["peak_host_bytes_setup"]) > 0
                read = rows["phases"].index("read")
                ok = ok and bool(np.isfinite(rows["wall"][0, :, read]).all())
    # Verification off: rank 0 never holds the whole input.
    cls = row_sums_ops[True]
    config = _config_once(comm, folder, cls.NAME, name="noverify.yaml", out="noverify",
                          input=inputs["file"], backend="cpu", verify={"enabled": False},
                          run={"repeats": 1, "warmup": 0, "progress": False})
    run(config, comm=comm)
    ok = ok and cls.loaded is False
    assert _all(comm, ok)


def test_row_problem_loads_the_whole_matrix_only_when_asked():
    from hisparse.layout import RowPart, RowProblem
    whole = generators.poisson([4, 5])
    calls = []

    def load():
        calls.append(1)
        return whole

    part = RowPart(np.arange(3, dtype=np.int64), whole.indptr[:4], whole.indices[:whole.indptr[3]],
                   whole.data[:whole.indptr[3]], whole.shape, whole.nnz, True, "row_blocks")
    problem = RowProblem(part, load)
    assert (problem.nrows, problem.ncols, problem.nnz) == (20, 20, whole.nnz)
    assert problem.value_dtype == np.float64 and not problem.loaded and not calls
    assert problem.take_part()["nrows"] == 20
    with pytest.raises(RuntimeError):
        problem.take_part()
    assert not calls
    np.testing.assert_array_equal(problem.to_scipy().toarray(), whole.to_scipy().toarray())
    np.testing.assert_array_equal(problem.indptr, whole.indptr)
    assert calls == [1] and problem.loaded


def test_fingerprint_changes_with_any_element_its_place_or_dtype():
    from hisparse.compiled import _fingerprint_words, fingerprint
    rng = np.random.default_rng(5)
    arrays = [rng.integers(0, 50, 200_001).astype(np.int32), rng.standard_normal(70_000),
              rng.standard_normal(5).astype(np.float32), np.zeros(0, np.int64)]
    base = fingerprint(*arrays)
    assert fingerprint(*[a.copy() for a in arrays]) == base
    with np.errstate(over="ignore"):  # the Python reference wraps modulo 2**64 too
        for array in arrays[1:3]:
            words = array.view(f"u{array.itemsize}")
            assert _fingerprint_words(words, np.uint64(3)) == \
                _fingerprint_words.py_func(words, np.uint64(3))
    for index, position in ((0, 123_456), (1, 0), (2, 4)):
        changed = [a.copy() for a in arrays]
        changed[index][position] += 1
        assert fingerprint(*changed) != base
    swapped = [a.copy() for a in arrays]
    first, second = np.flatnonzero(swapped[0] != swapped[0][0])[:1][0], 0
    swapped[0][[first, second]] = swapped[0][[second, first]]  # the same values, moved
    assert fingerprint(*swapped) != base
    assert fingerprint(arrays[1], arrays[0], *arrays[2:]) != base  # arrays in another order
    assert fingerprint(arrays[0].view(np.float32), *arrays[1:]) != base  # same bytes, dtype


def test_one_rank_keeps_its_part_as_the_whole_matrix_while_untouched():
    """keep_whole: the part's own arrays serve as the whole matrix (no load), unless the
    operation changed one of them in place -- then the whole matrix is loaded again."""
    from hisparse.layout import RowPart, RowProblem
    whole = generators.poisson([6, 7])
    for change in (None, "indices", "data", "indptr"):
        calls = []

        def load():
            calls.append(1)
            return whole

        part = RowPart(np.arange(whole.nrows, dtype=np.int64), whole.indptr.copy(),
                       whole.indices.copy(), whole.data.copy(), whole.shape, whole.nnz, True,
                       "nnz_balanced")
        problem = RowProblem(part, load, keep_whole=True)
        arrays = problem.take_part()
        if change == "indices":  # a permutation within a row: same values, moved
            row = slice(int(whole.indptr[10]), int(whole.indptr[11]))
            arrays["indices"][row] = arrays["indices"][row][::-1].copy()
        elif change is not None:
            arrays[change][-1] += 1
        matrix = problem.matrix
        assert calls == ([] if change is None else [1]) and problem.loaded
        if change is None:
            assert matrix.indices is arrays["indices"] and matrix.data is arrays["data"]
            assert matrix.shape == whole.shape and matrix.symmetric
        else:
            assert matrix is whole


def test_one_rank_keeps_a_slow_to_make_matrix_only(tmp_path, monkeypatch):
    """The rule (layout.keeps_whole), and a one-rank SpMV run that verifies against the kept
    R-MAT graph without making it again (a part changed in place: the RowProblem test above)."""
    from hisparse import driver
    from hisparse.config import load_config
    from hisparse.layout import _rows
    one, two = types.SimpleNamespace(size=1), types.SimpleNamespace(size=2)
    big = types.SimpleNamespace(local_nnz=_rows.KEEP_WHOLE_MIN_NNZ)
    small = types.SimpleNamespace(local_nnz=_rows.KEEP_WHOLE_MIN_NNZ - 1)
    rmat = {"generate": {"kind": "rmat", "scale": 8}}

    def config(source, **sections):
        return load_config(str(write_config(tmp_path, "spmv", input=source, **sections)))

    assert _rows.keeps_whole(one, config(rmat), big)
    assert not _rows.keeps_whole(two, config(rmat), big)
    assert not _rows.keeps_whole(one, config(rmat), small)
    assert not _rows.keeps_whole(one, config(rmat, verify={"enabled": False}), big)
    assert not _rows.keeps_whole(one, config({"generate": {"kind": "poisson", "dims": [9, 9]}}),
                                 big)
    monkeypatch.setattr(_rows, "KEEP_WHOLE_MIN_NNZ", 0)
    made = []
    real = _rows.read_problem
    monkeypatch.setattr(_rows, "read_problem", lambda *a: made.append(1) or real(*a))
    path = driver.run(str(write_config(tmp_path, "spmv", {"x": "random"}, input=rmat,
                                       backend="cpu", run={"repeats": 1, "warmup": 0})),
                      comm=get_world())
    run, _ = read_run(path)
    assert run["attrs"]["verify_passed"] and made == []


@pytest.mark.parametrize("source", [
    {"generate": {"kind": "rmat", "scale": 8, "edge_factor": 8, "seed": 3}},
    {"generate": {"kind": "poisson", "dims": [9, 8, 7], "stencil": 27}},
    {"generate": {"kind": "random_matrix", "rows": 300, "cols": 200, "nnz_per_row": 6,
                  "seed": 4, "power_law": 1.2}},
    "file"], ids=["rmat", "poisson", "random", "file"])
@pytest.mark.parametrize("precision,index_width", [("fp64", "auto"), ("fp32", "int64")])
def test_one_ranks_kept_part_is_what_verification_would_load(tmp_path, source, precision,
                                                             index_width):
    """What one rank keeps for verification equals the whole matrix read or made again
    (read_problem), array for array and dtype for dtype: using it changes no check."""
    from hisparse.config import load_config
    from hisparse.layout import read_problem, read_rows
    from hisparse.ops import get_operation_class
    if source == "file":
        write_matrix(tmp_path / "a.h5", _awkward_matrix(np.int64, seed=4), mode="w")
        source = {"path": str(tmp_path / "a.h5")}
    config = load_config(str(write_config(tmp_path, "spmv", input=source,
                                          precision=precision, index_width=index_width)))
    op_cls = get_operation_class("spmv")
    problem = read_rows(get_world(), config, op_cls, "nnz_balanced", keep_whole=True)
    problem.take_part()
    kept, loaded = problem.matrix, read_problem(config, op_cls)
    for name in ("indptr", "indices", "data"):
        got, want = getattr(kept, name), getattr(loaded, name)
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    assert kept.shape == loaded.shape and kept.symmetric == loaded.symmetric


def test_row_input_needs_a_matrix_operation():
    """A row layout declared by a tensor operation stops before anything is read."""
    from hisparse.layout import RowLayout
    from hisparse.ops import Operation
    cls = type("TensorRows", (Operation,), {"INPUT_KIND": "tensor"})
    with pytest.raises(TypeError, match="RowLayout needs INPUT_KIND 'matrix'"):
        RowLayout("row_blocks").load(None, cls.__new__(cls))


def test_a_single_process_reads_by_rows_without_a_launcher(tmp_path):
    """comm.size == 1 (no mpiexec): the part is the whole matrix, as read_matrix reads it."""
    write_matrix(tmp_path / "a.h5", _awkward_matrix(np.int64, seed=3), mode="w")
    whole = read_matrix(tmp_path / "a.h5")
    part = read_row_part(get_world(), str(tmp_path / "a.h5"), "/", "nnz_balanced")
    np.testing.assert_array_equal(part.indptr, whole.indptr)
    np.testing.assert_array_equal(part.indices, whole.indices)
    np.testing.assert_array_equal(part.data, whole.data)
    with pytest.raises(ValueError, match="unknown row partition"):
        read_row_part(get_world(), str(tmp_path / "a.h5"), "/", "product_balanced")


@pytest.mark.parametrize("operation,params,source,strategy,layout,by_parts", [
    ("spmv", {}, {"kind": "poisson", "dims": [6, 5]}, "row_modulo", "RowLayout", True),
    ("spgemm", {}, {"kind": "poisson", "dims": [6, 5]}, "product_balanced", "RowLayout", True),
    ("sptv", {}, {"kind": "random_tensor", "dims": [5, 6, 7], "nnz": 50}, "grid_uniform",
     "TensorGridLayout", True),
    ("cpals", {"rank": 2}, {"kind": "random_tensor", "dims": [5, 6, 7], "nnz": 50}, "row_blocks",
     "TensorSliceLayout", True),
    ("cpals", {"rank": 2, "init": "nvecs"}, {"kind": "random_tensor", "dims": [5, 6, 7],
                                             "nnz": 50}, "row_blocks", "WholeOnRoot", False),
    ("cholesky", {}, {"kind": "poisson", "dims": [6, 5]}, "auto", "WholeOnRoot", False)],
    ids=["spmv", "spgemm", "sptv", "cpals", "cpals-nvecs", "cholesky"])
def test_each_operation_declares_its_layout_known_before_the_run(tmp_path, operation, params,
                                                                 source, strategy, layout,
                                                                 by_parts):
    """The layout an operation declares for a run, and whether it reads by parts as the memory
    estimate asks before the run (from the config alone), agree."""
    from hisparse.config import load_config
    from hisparse.context import RunContext
    from hisparse.ops import get_operation_class
    from hisparse.parallel import node_local
    from hisparse.timing import PhaseTimer
    config = load_config(str(write_config(tmp_path, operation, params, input={"generate": source},
                                          backend="cpu", partition={"strategy": strategy})))
    cls = get_operation_class(operation)
    comm = get_world()
    op = cls(RunContext(config=config, comm=comm, local_comm=node_local(comm), backend="cpu",
                        timer=PhaseTimer(cls.phases()), device=None))
    declared = op.layout()
    assert type(declared).__name__ == layout and declared.BY_PARTS == by_parts
    assert cls.reads_input_by_parts(config) == by_parts


@pytest.mark.parametrize("size", [2, 3, 4])
def test_sampled_reach_tells_a_mesh_from_a_power_law_graph(tmp_path, size):
    """sampled_reach, before any read: the share of the entries of a few rows spread over a
    rank's even block whose columns fall outside its even block of x, as SciPy counts them on
    the same rows -- small for a 3-D stencil (its split takes the few-ghost way), most of them
    for an R-MAT graph; None for a generated input and for a file that cannot be read."""
    from hisparse.distmatrix import CROSSING_SHARE
    from hisparse.layout import sampled_reach
    from hisparse.layout._rows import REACH_SAMPLE_ROWS
    shares = {}
    for name, matrix in (("mesh", generators.poisson([12, 12, 12], stencil=27)),
                         ("graph", generators.rmat(12, seed=3))):
        path = tmp_path / f"{name}.h5"
        write_matrix(str(path), matrix)
        a = matrix.to_scipy().tocsr()
        config = {"input": {"generate": None, "path": str(path), "group": "/"}}
        for rank in range(size):
            lo, hi = rank * a.shape[0] // size, (rank + 1) * a.shape[0] // size
            c0, c1 = rank * a.shape[1] // size, (rank + 1) * a.shape[1] // size
            rows = np.unique(np.linspace(lo, hi - 1, REACH_SAMPLE_ROWS).astype(np.int64))
            columns = np.concatenate([a.indices[a.indptr[r]:a.indptr[r + 1]] for r in rows])
            expected = np.count_nonzero((columns < c0) | (columns >= c1)) / len(columns)
            got = sampled_reach(config, rank, size)
            assert got == pytest.approx(expected)
            shares.setdefault(name, []).append(got)
    assert max(shares["mesh"]) <= CROSSING_SHARE < min(shares["graph"])
    generated = {"input": {"generate": {"kind": "poisson", "dims": [8, 8]}, "path": None,
                           "group": "/"}}
    assert sampled_reach(generated, 0, size) is None
    missing = {"input": {"generate": None, "path": str(tmp_path / "none.h5"), "group": "/"}}
    assert sampled_reach(missing, 0, size) is None


def test_a_repeated_value_is_cast_once_and_its_overflow_named():
    """Values given as one value repeated are cast as that value (still repeated, no array
    made), and one that overflows the precision stops the run naming its first place."""
    from hisparse.arrays import repeated
    from hisparse.errors import HisparseError
    from hisparse.layout import RowPart
    comm = get_world()

    def part(value):
        return RowPart(np.arange(2, dtype=np.int64), np.array([0, 3, 5]),
                       np.array([0, 1, 2, 0, 1]), repeated(value, 5), (2, 3), 5, False,
                       "nnz_balanced", None)
    cast = cast_row_part(comm, part(2.0), np.float32, "auto", "in.h5", "fp32")
    assert cast.data.dtype == np.float32 and list(cast.data) == [2.0] * 5
    assert repeated_value(cast.data) is not None
    with pytest.raises(HisparseError, match=r"in.h5: value 1e\+300 at row 0, column 0 "
                                            r"overflows fp32"):
        cast_row_part(comm, part(1e300), np.float32, "auto", "in.h5", "fp32")

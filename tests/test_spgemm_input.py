"""SpGEMM's input read by rows (issue 13): every rank reads or generates only its rows of A (for
``product_balanced`` and ``flops_balanced`` a provisional block, for ``auto`` its row-modulo rows,
moved once the products are known) and makes B itself,
and ends with exactly what the rank-0 path (rank 0 reads A and B, partitions, scatters A's rows,
broadcasts B) gives it.

Each case runs the driver twice on the same input, read whole on rank 0 (the rank-0 path) and by rows,
and compares every rank's operands array for array (CRCs of A's rows, B, the products, with
dtypes), the whole C, and C against a SciPy product computed here from the input read or
generated whole (the driver's own verification, also SciPy, must pass too).
"""
import zlib

import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.errors import HisparseError
from hisparse.formats import CSRMatrix
from hisparse.io import read_matrix, write_matrix
from hisparse.layout import RowProblem, WholeOnRoot
from hisparse.ops.spgemm.op import SpGEMM
from hisparse.parallel import get_world

from helpers import read_run
from test_parallel_input import _all, _config_once, _shared_dir

A_SHAPE = (150, 150)
GENERATED = {"kind": "rmat", "scale": 7, "edge_factor": 6, "seed": 11}  # 128 x 128
PRECISIONS = {"fp64": (np.float64, 1e-12), "fp32": (np.float32, 1e-5)}


def _awkward_square(seed):
    """A square A with empty rows (a run of them and the last), one long row with duplicate
    columns, unsorted columns: what the readers must sort and merge alike."""
    rng = np.random.default_rng(seed)
    m, n = A_SHAPE
    lengths = rng.integers(0, 7, m)
    lengths[30:52] = 0
    lengths[-1] = 0
    lengths[90] = 260  # more than n: repeated columns, summed on reading
    rows = np.repeat(np.arange(m), lengths)
    cols = rng.integers(0, n, len(rows))
    order = np.lexsort((rng.random(len(rows)), rows))
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return CSRMatrix(indptr, cols[order].astype(np.int32),
                     rng.standard_normal(len(rows))[order], (m, n))


def _right_operand(rows, seed):
    """A B of ``rows`` rows (int64 indices in the file), with empty rows and a long one."""
    rng = np.random.default_rng(seed)
    b = sp.random(rows, 70, density=0.08, random_state=rng, format="csr")
    b = sp.vstack([b[:10], sp.csr_matrix((8, 70)), b[18:]]).tocsr()
    b[5, :] = rng.standard_normal(70)
    b = b.tocsr()
    return CSRMatrix(b.indptr.astype(np.int64), b.indices.astype(np.int64), b.data, b.shape)


def _crc(*arrays):
    digest = 0
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest = zlib.crc32(array.dtype.str.encode() + array.tobytes(), digest)
    return int(digest)


@pytest.fixture
def recorded(monkeypatch):
    """SpGEMM recording, per rank, CRCs of its operands and whether it read by rows; and
    (class attribute ``loaded``) whether rank 0 ended up holding the whole A."""
    info = SpGEMM.rank_info

    def rank_info(self):
        local = self.local
        return dict(info(self), a_crc=_crc(local.a.indptr, local.a.indices, local.a.data,
                                           self.rows),
                    b_crc=_crc(local.b.indptr, local.b.indices, local.b.data),
                    products_crc=_crc(local.products),
                    by_rows=int(isinstance(self.problem, RowProblem)))

    teardown = SpGEMM.teardown

    def record_teardown(self):
        type(self).loaded = getattr(self.problem, "loaded", True)
        teardown(self)

    monkeypatch.setattr(SpGEMM, "rank_info", rank_info)
    monkeypatch.setattr(SpGEMM, "teardown", record_teardown)
    return monkeypatch


def _c_within_tolerance(arrays, a, b, rtol):
    """C from /result equals SciPy's A B: the same row pointers and sorted columns (SciPy's
    product may drop cancelled zeros, none here), values within ``rtol`` of max |C|."""
    reference = (a.to_scipy().astype(np.float64) @ b.to_scipy().astype(np.float64)).tocsr()
    reference.sort_indices()
    return (np.array_equal(arrays["indptr"], reference.indptr)
            and np.array_equal(arrays["indices"], reference.indices)
            and np.abs(arrays["data"] - reference.data).max(initial=0.0)
            <= rtol * max(np.abs(reference.data).max(initial=0.0), 1.0))


def _same_runs(rank0_run, rows_run, nprocs):
    """The rank-0 path's run and the run read by rows: every rank's operands (CRCs), the
    figures, verification passed, and C array for array."""
    (rank0, rank0_c), (rows, rows_c) = rank0_run, rows_run
    ok = list(rank0["rank_vars"]["by_rows"]) == [0] * nprocs
    ok = ok and list(rows["rank_vars"]["by_rows"]) == [1] * nprocs
    for key in ("a_crc", "b_crc", "products_crc", "n_rows", "nnz", "products", "nnz_c"):
        ok = ok and list(rows["rank_vars"][key]) == list(rank0["rank_vars"][key])
    for key in ("products", "nnz_c", "flops", "bytes_moved", "index_dtype", "value_dtype",
                "global_nnz"):
        ok = ok and rows["attrs"][key] == rank0["attrs"][key]
    ok = ok and rows["attrs"]["verify_passed"] and rank0["attrs"]["verify_passed"]
    return ok and set(rows_c) == set(rank0_c) == {"indptr", "indices", "data"} and \
        all(np.array_equal(rows_c[k], rank0_c[k]) and rows_c[k].dtype == rank0_c[k].dtype
            for k in rank0_c)


@pytest.mark.parallel(nprocs=[1, 2, 4])
def test_every_rank_gets_what_the_rank0_path_gives_and_so_does_c(nprocs, recorded):
    from hisparse.driver import run
    comm = get_world()
    folder = _shared_dir(comm)
    a_file, b_file, b_gen_file = folder / "a.h5", folder / "b.h5", folder / "b_gen.h5"
    if comm.rank == 0:
        write_matrix(a_file, _awkward_square(1), group="/A", mode="w")
        write_matrix(b_file, _right_operand(A_SHAPE[1], 2), group="/B", mode="w")
        write_matrix(b_gen_file, _right_operand(2 ** GENERATED["scale"], 3), group="/B",
                     mode="w")
    comm.Barrier()
    sources = {"file": ({"path": str(a_file), "group": "/A"}, f"{b_file}:/B",
                        lambda: read_matrix(a_file, "/A"), lambda: read_matrix(b_file, "/B")),
               "generated": ({"generate": GENERATED}, f"{b_gen_file}:/B",
                             lambda: generators.generate(GENERATED),
                             lambda: read_matrix(b_gen_file, "/B"))}
    cases = [(label, b_choice, strategy, precision, width)
             for label in sources for b_choice in ("same", "file")
             for strategy in SpGEMM.PARTITIONS + ("auto",)
             for precision, width in (("fp64", "auto"), ("fp32", "int64"))]
    ok, checked = True, 0
    layout = SpGEMM.layout  # by rows; the rank-0 path is the whole input on rank 0
    for label, b_choice, strategy, precision, width in cases:
        source, b_spec, whole_a, whole_b = sources[label]
        b_choice = b_spec if b_choice == "file" else b_choice
        runs = {}
        for row_input in (False, True):
            recorded.setattr(SpGEMM, "layout", layout if row_input else
                             lambda self: WholeOnRoot(self.INPUT_KIND))
            name = f"{label}-{b_choice != 'same'}-{strategy}-{precision}-{width}-{row_input}"
            config = _config_once(comm, folder, "spgemm", {"b": b_choice}, name=f"{name}.yaml",
                                  out=name, input=source, backend="cpu", precision=precision,
                                  index_width=width, partition={"strategy": strategy},
                                  run={"repeats": 1, "warmup": 0, "progress": False})
            path = run(config, comm=comm)
            if comm.rank == 0:
                runs[row_input] = read_run(path)
        if comm.rank == 0:
            value_dtype, rtol = PRECISIONS[precision]
            a = whole_a().astype(value_dtype)
            b = a if b_choice == "same" else whole_b().astype(value_dtype)
            ok = ok and _same_runs(runs[False], runs[True], nprocs)
            ok = ok and _c_within_tolerance(runs[True][1], a, b, rtol)
            ok = ok and runs[True][0]["attrs"]["index_dtype"] == \
                ("int64" if width == "int64" else "int32")
            checked += 1
    ok = ok and (comm.rank != 0 or checked == len(cases) == 8 * (len(SpGEMM.PARTITIONS) + 1))
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[1, 2])
def test_rank0_loads_the_whole_a_only_when_b_is_a_or_verification_asks(nprocs, recorded):
    """B from a file, verification off: no rank holds all of A. ``b: same`` on several ranks:
    every rank holds it, as B, put together from the ranks' parts (no rank reads the whole file
    again; that B is the rank-0 path's, array for array:
    test_every_rank_gets_what_the_rank0_path_gives_and_so_does_c)."""
    from hisparse.driver import run
    comm = get_world()
    folder = _shared_dir(comm)
    if comm.rank == 0:
        write_matrix(folder / "a.h5", _awkward_square(4), mode="w")
        write_matrix(folder / "b.h5", _right_operand(A_SHAPE[1], 5), mode="w")
    comm.Barrier()
    expected = {f"{folder / 'b.h5'}:/": False, "same": False}
    ok = True
    for b_choice, loaded in expected.items():
        name = f"noverify-{b_choice == 'same'}"
        config = _config_once(comm, folder, "spgemm", {"b": b_choice}, name=f"{name}.yaml",
                              out=name, input={"path": str(folder / "a.h5")}, backend="cpu",
                              verify={"enabled": False}, partition={"strategy": "row_modulo"},
                              run={"repeats": 1, "warmup": 0, "progress": False})
        run(config, comm=comm)
        ok = ok and SpGEMM.loaded is loaded
    assert _all(comm, ok)


@pytest.mark.parallel(nprocs=[2])
def test_a_bad_b_stops_every_rank(nprocs, recorded):
    from hisparse.driver import run
    comm = get_world()
    folder = _shared_dir(comm)
    if comm.rank == 0:
        write_matrix(folder / "wide.h5", CSRMatrix.from_scipy(
            sp.random(40, 30, density=0.2, random_state=0, format="csr")), mode="w")
        write_matrix(folder / "b.h5", _right_operand(31, 6), mode="w")
    comm.Barrier()
    cases = {"same": r"'same' needs a square A, got shape \(40, 30\)",
             f"{folder / 'b.h5'}:/": r"B has 31 rows but A has 30 columns"}
    for b_choice, message in cases.items():
        name = f"bad-{b_choice == 'same'}"
        config = _config_once(comm, folder, "spgemm", {"b": b_choice}, name=f"{name}.yaml",
                              out=name, input={"path": str(folder / "wide.h5")}, backend="cpu",
                              partition={"strategy": "row_modulo"},
                              run={"repeats": 1, "warmup": 0, "progress": False})
        with pytest.raises(HisparseError, match=message):
            run(config, comm=comm)

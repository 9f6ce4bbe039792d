"""``output.collect``: gather (rank 0 writes /result), parts (each rank writes its part file,
joined in the results file by HDF5 virtual datasets) and none (no result arrays; verification
by the operation's checksums, or skipped with the reason)."""
from pathlib import Path

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse.formats import COOTensor, CSRMatrix
from hisparse.io import read_results, write_matrix, write_tensor

from conftest import run_hisparse
from helpers import read_run, run_config, write_config


def _matrix_input(tmp_path):
    """A random 61 x 61 matrix with empty rows; returns (input section, SciPy matrix)."""
    matrix = sp.random(61, 61, density=0.08, random_state=7, format="csr")
    matrix = (matrix + sp.eye(61, format="csr")).tolil()
    matrix[[5, 40], :] = 0
    matrix = matrix.tocsr()
    matrix.eliminate_zeros()
    path = tmp_path / "a.h5"
    write_matrix(path, CSRMatrix.from_scipy(matrix))
    return {"path": str(path)}, matrix


def _tensor_input(tmp_path):
    """A random 3-order COO tensor (distinct coordinates); returns (input section, tensor)."""
    rng = np.random.default_rng(11)
    shape = (9, 8, 12)
    keys = rng.choice(np.prod(shape), size=300, replace=False)
    indices = np.stack(np.unravel_index(np.sort(keys), shape), axis=1).astype(np.int64)
    tensor = COOTensor(indices, rng.standard_normal(300), shape)
    path = tmp_path / "x.h5"
    write_tensor(path, tensor)
    return {"path": str(path)}, tensor


def _sptv_reference(tensor):
    """Y = X x_2 ones: per (i, j) fiber, the sum of its values; sorted by (i, j)."""
    keys = tensor.indices[:, 0] * tensor.shape[1] + tensor.indices[:, 1]
    present, inverse = np.unique(keys, return_inverse=True)
    values = np.bincount(inverse.ravel(), weights=tensor.values)
    coords = np.stack(np.unravel_index(present, tensor.shape[:2]), axis=1)
    return coords, values


def _run(tmp_path, op, params, section, collect, nprocs, out, strategy="auto", verify=True):
    cfg = write_config(tmp_path, op, params, name=f"{out}.yaml", out=out, input=section,
                       backend="cpu", output={"dir": str(tmp_path / out), "collect": collect},
                       partition={"strategy": strategy}, verify={"enabled": verify})
    if collect != "parts":
        return run_config(tmp_path, cfg, nprocs=nprocs, out=out)
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return read_run(results_in_parts(tmp_path, out))


def _part_files(tmp_path, out):
    return sorted((tmp_path / out).glob("*.part*.h5"))


@pytest.mark.parametrize("nprocs,strategy", [(1, "auto"), (2, "nnz_balanced"),
                                             (2, "row_modulo")])
def test_spmv_parts_join_to_the_gathered_y(tmp_path, nprocs, strategy):
    section, matrix = _matrix_input(tmp_path)
    expected = matrix @ np.ones(matrix.shape[1])
    gathered, gathered_arrays = _run(tmp_path, "spmv", {"x": "ones"}, section, "gather",
                                     nprocs, "gather", strategy)
    run, _ = _run(tmp_path, "spmv", {"x": "ones"}, section, "parts", nprocs, "parts", strategy)
    assert run["attrs"]["verify_passed"] and run["attrs"]["verify_enabled"]
    assert run["attrs"]["verify_seconds"] > 0  # the reference's time, recorded
    with h5py.File(results_in_parts(tmp_path), "r") as handle:
        assert handle["result/y"].is_virtual
        y = handle["result/y"][()]
        assert "y_rows" not in handle["result"]  # both strategies give runs of rows
    np.testing.assert_array_equal(y, gathered_arrays["y"])
    np.testing.assert_allclose(y, expected, rtol=1e-12)
    parts = _part_files(tmp_path, "parts")
    assert [p.name.rsplit(".part", 1)[1] for p in parts] == [f"{r}.h5" for r in range(nprocs)]
    pieces = []
    for part in parts:
        with h5py.File(part, "r") as handle:
            pieces.append(handle["result/y"][()])
    assert sum(len(p) for p in pieces) == matrix.shape[0]
    for rank, piece in enumerate(pieces):  # each part file holds its rank's rows
        want = expected[rank::nprocs] if strategy == "row_modulo" else None
        if want is not None:
            np.testing.assert_allclose(piece, want, rtol=1e-12)
    if strategy != "row_modulo":
        np.testing.assert_allclose(np.concatenate(pieces), expected, rtol=1e-12)
    assert gathered["attrs"]["verify_passed"]


@pytest.mark.parametrize("nprocs", [1, 2])
def test_spmv_parts_without_verification_still_joins_y(tmp_path, nprocs):
    # Nothing on rank 0 needs all of y (collect skips the gather): each rank writes its rows,
    # the results file joins them.
    section, matrix = _matrix_input(tmp_path)
    run, _ = _run(tmp_path, "spmv", {"x": "ones"}, section, "parts", nprocs, "quiet",
                  verify=False)
    assert not run["attrs"]["verify_enabled"] and "verify_seconds" not in run["attrs"]
    with h5py.File(results_in_parts(tmp_path, "quiet"), "r") as handle:
        np.testing.assert_allclose(handle["result/y"][()], matrix @ np.ones(matrix.shape[1]),
                                   rtol=1e-12)


def results_in_parts(tmp_path, out="parts"):
    """The results file of a parts run (the one .h5 that is not a part file)."""
    files = [p for p in (tmp_path / out).glob("*.h5") if ".part" not in p.name]
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("nprocs", [1, 2])
def test_sptv_parts_and_none(tmp_path, nprocs):
    section, tensor = _tensor_input(tmp_path)
    coords, values = _sptv_reference(tensor)
    params = {"mode": 2, "vector": "ones", "chunks": 2}
    run, _ = _run(tmp_path, "sptv", params, section, "parts", nprocs, "parts")
    attrs = run["attrs"]
    assert attrs["verify_enabled"] and attrs["verify_passed"] and attrs["sptv_collect"] == "parts"
    with h5py.File(results_in_parts(tmp_path), "r") as handle:
        got_coords, got_values = handle["result/coords"][()], handle["result/values"][()]
    assert len(_part_files(tmp_path, "parts")) == nprocs
    order = np.lexsort(got_coords.T[::-1])
    np.testing.assert_array_equal(got_coords[order], coords)
    np.testing.assert_allclose(got_values[order], values, rtol=1e-12)

    run, arrays = _run(tmp_path, "sptv", params, section, "none", nprocs, "none")
    attrs = run["attrs"]
    assert arrays == {} and attrs["verify_enabled"] and attrs["verify_passed"]
    assert attrs["sptv_y_sum"] == pytest.approx(values.sum(), rel=1e-12)
    assert _part_files(tmp_path, "none") == []


@pytest.mark.parametrize("nprocs", [1, 2])
def test_spmv_none_writes_no_arrays_and_says_why_unverified(tmp_path, nprocs):
    section, _ = _matrix_input(tmp_path)
    run, arrays = _run(tmp_path, "spmv", {"x": "ones"}, section, "none", nprocs, "none")
    attrs = run["attrs"]
    assert arrays == {} and not attrs["verify_enabled"]
    assert "output.collect: none" in attrs["verify_skipped"]
    assert _part_files(tmp_path, "none") == []


def test_parts_refused_where_unsupported_or_a_part_file_exists(tmp_path):
    section, _ = _matrix_input(tmp_path)
    cfg = write_config(tmp_path, "spgemm", {}, name="g.yaml", out="g", input=section,
                       backend="cpu", output={"dir": str(tmp_path / "g"), "collect": "parts"})
    proc = run_config(tmp_path, cfg, out="g", expect_rc=2)
    assert "output.collect" in proc.stderr and "spgemm" in proc.stderr
    out = tmp_path / "taken"
    out.mkdir()
    (out / "fixed.part0.h5").write_bytes(b"")
    cfg = write_config(tmp_path, "spmv", {"x": "ones"}, name="t.yaml", out="taken",
                       input=section, backend="cpu",
                       output={"dir": str(out), "filename": "fixed.h5", "collect": "parts"})
    proc = run_config(tmp_path, cfg, out="taken", expect_rc=2)
    assert "output.collect" in proc.stderr and "fixed.part0.h5" in proc.stderr
    assert not (out / "fixed.h5").exists()


def test_results_file_reads_the_parts_from_another_directory(tmp_path, monkeypatch):
    section, matrix = _matrix_input(tmp_path)
    _run(tmp_path, "spmv", {"x": "ones"}, section, "parts", 1, "parts")
    monkeypatch.chdir(tmp_path / "..")
    _, arrays = read_run(results_in_parts(tmp_path))
    np.testing.assert_allclose(arrays["y"], matrix @ np.ones(matrix.shape[1]), rtol=1e-12)


def test_parts_with_scattered_rows_are_joined_in_rank_order_with_their_rows(tmp_path):
    """Rows that are no arithmetic run: the virtual dataset holds the parts in rank order and
    ``<name>_rows`` gives each row's place in the whole array."""
    from hisparse.io import row_placement, write_result_part
    from hisparse.io._results import _virtual_result
    whole = np.arange(10.0) ** 2
    ranks_rows = [np.array([0, 1, 5, 9]), np.array([2, 3, 4, 6, 7, 8])]
    names, parts = [], []
    for rank, rows in enumerate(ranks_rows):
        name = f"r.part{rank}.h5"
        written = write_result_part(str(tmp_path / name), {"y": whole[rows]})
        shape, dtype = written["y"]
        names.append(name)
        parts.append((shape, dtype, row_placement(rows)))
    with h5py.File(tmp_path / "r.h5", "w") as handle:
        _virtual_result(handle.create_group("result"), "y", names, parts)
    with h5py.File(tmp_path / "r.h5", "r") as handle:
        y, rows = handle["result/y"][()], handle["result/y_rows"][()]
    np.testing.assert_array_equal(rows, np.concatenate(ranks_rows))
    np.testing.assert_array_equal(y, whole[rows])
    assert row_placement(np.array([3, 5, 7])) == (3, 2)


def test_missing_part_file_is_named_by_the_readers(tmp_path):
    """A results file moved without its part files reads the missing rows as NaN (HDF5's fill,
    no error): read_results lists the missing part and hisparse report warns, naming it."""
    section, matrix = _matrix_input(tmp_path)
    _run(tmp_path, "spmv", {"x": "ones"}, section, "parts", 2, "moved", verify=False)
    results = results_in_parts(tmp_path, "moved")
    assert read_results(str(results))["missing_parts"] == []
    lost = _part_files(tmp_path, "moved")[1]
    lost.unlink()
    with h5py.File(results, "r") as handle:  # what the check is for: no error, NaN rows
        assert np.isnan(handle["result/y"][()]).any()
    assert read_results(str(results))["missing_parts"] == [str(lost)]
    proc = run_hisparse(["report", str(results)])
    assert proc.returncode == 0, proc.stderr
    assert "part files that are missing" in proc.stderr and lost.name in proc.stderr


@pytest.mark.parallel(nprocs=[2])
def test_every_rank_names_the_results_file_of_rank_0(nprocs, tmp_path, monkeypatch):
    """The results file's name holds the run's start ({utc}). Every rank but 0 reads its clock an
    hour late here: they must still name rank 0's file, or the part files they write are not the
    ones its /result joins (which would read as NaN)."""
    import datetime
    from mpi4py import MPI
    from hisparse import _metadata, driver
    comm = MPI.COMM_WORLD
    if comm.rank:
        clock = _metadata.utc_now
        monkeypatch.setattr(_metadata, "utc_now",
                            lambda: clock() + datetime.timedelta(hours=1))
    root = Path(comm.bcast(str(tmp_path) if comm.rank == 0 else None, root=0))
    if comm.rank == 0:
        section, matrix = _matrix_input(root)
        cfg = write_config(root, "spmv", {"x": "ones"}, name="skew.yaml", out="skew",
                           input=section, backend="cpu",
                           output={"dir": str(root / "skew"), "collect": "parts"},
                           verify={"enabled": False})
    cfg = comm.bcast(str(cfg) if comm.rank == 0 else None, root=0)
    driver.run(cfg, comm=comm)
    ok = True
    if comm.rank == 0:
        results = results_in_parts(root, "skew")
        stem = results.name[:-len(".h5")]
        parts = _part_files(root, "skew")
        ok = [p.name for p in parts] == [f"{stem}.part{r}.h5" for r in range(nprocs)]
        with h5py.File(results, "r") as handle:
            ok = ok and np.allclose(handle["result/y"][()], matrix @ np.ones(matrix.shape[1]),
                                    rtol=1e-12)
    assert comm.allreduce(bool(ok), op=MPI.LAND)

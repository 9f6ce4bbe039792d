"""``operation.params.ordering_file``: the fill-reducing ordering computed once, written to an
HDF5 file, and read by later runs of the same matrix (any rank count) instead of computed again;
a file of another matrix or method, or not a permutation, is refused by name; the file is never
replaced."""
import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spl

from hisparse import generators
from hisparse.errors import HisparseError, InputError
from hisparse.formats import CSRMatrix
from hisparse.io import write_matrix
from hisparse.ops.cholesky.ordering import offdiagonal_pattern
from hisparse.ops.cholesky.ordering_file import ORDERING_SCHEMA, OrderingFile, pattern_digest
from hisparse.ops.cholesky.symbolic import analyze

from helpers import run_config, write_config


#: the ordering the tests save and read: level-set dissection needs no pymetis (CI has none)
METHOD = "dissection"


def _grid(n=20):
    return sp.csr_matrix(generators.poisson([n, n]).to_scipy())


def _input(tmp_path, matrix, name="a.h5"):
    path = tmp_path / name
    write_matrix(path, CSRMatrix.from_scipy(matrix, symmetric=True))
    return {"path": str(path)}


def _digest(matrix):
    return pattern_digest(*offdiagonal_pattern(matrix))


def test_a_saved_ordering_is_the_one_used(tmp_path):
    """The file's permutation is what the analysis uses: the identity saved as a dissection
    ordering gives the natural ordering's factor, not the dissection's."""
    a = _grid()
    path = tmp_path / "order.h5"
    OrderingFile(path, METHOD).write(np.arange(a.shape[0]), _digest(a), METHOD)
    sym = analyze(a, METHOD, ordering_file=str(path))
    assert sym.stats["ordering_source"] == "file" and sym.stats["ordering"] == METHOD
    assert sym.flops == analyze(a, "natural").flops
    assert sym.flops > analyze(a, METHOD).flops


def test_computed_then_read_gives_the_same_analysis(tmp_path):
    a = _grid()
    path = str(tmp_path / "order.h5")
    first = analyze(a, METHOD, ordering_file=path)
    assert first.stats["ordering_source"] == "computed and saved"
    with h5py.File(path, "r") as handle:
        assert handle.attrs["schema"] == ORDERING_SCHEMA and handle.attrs["rows"] == a.shape[0]
        saved = handle["perm"][()]
    again = analyze(a, METHOD, ordering_file=path, nranks=3)
    assert again.stats["ordering_source"] == "file"
    assert again.flops == first.flops and again.factor_nnz == first.factor_nnz
    # the postorder composes with the saved order: the same permutation of columns
    np.testing.assert_array_equal(np.sort(saved), np.arange(a.shape[0]))
    np.testing.assert_array_equal(first.perm, analyze(a, METHOD, ordering_file=path).perm)


def _write_raw(path, perm, rows, digest, ordering=METHOD):
    with h5py.File(path, "w") as handle:
        handle.attrs.update({"schema": ORDERING_SCHEMA, "rows": rows, "pattern_digest": digest,
                             "ordering": ordering})
        handle.create_dataset("perm", data=perm)


def test_files_that_do_not_belong_are_refused_by_name(tmp_path):
    a, other = _grid(20), _grid(21)
    n, digest = a.shape[0], _digest(a)
    cases = {}
    cases["another matrix"] = tmp_path / "other.h5"
    OrderingFile(cases["another matrix"], METHOD).write(np.arange(other.shape[0]),
                                                         _digest(other), METHOD)
    # the same size, another pattern (the grid without one of its couplings)
    cut = a.tolil()
    cut[0, 1] = cut[1, 0] = 0.0
    cut = sp.csr_matrix(cut)
    cut.eliminate_zeros()
    cases["another pattern"] = tmp_path / "cut.h5"
    OrderingFile(cases["another pattern"], METHOD).write(np.arange(n), _digest(cut), METHOD)
    cases["an rcm ordering"] = tmp_path / "rcm.h5"
    OrderingFile(cases["an rcm ordering"], "rcm").write(np.arange(n), digest, "rcm")
    repeated = np.arange(n)
    repeated[1] = 0
    cases["a repeated row"] = tmp_path / "repeated.h5"
    _write_raw(cases["a repeated row"], repeated, n, digest)
    cases["a float perm"] = tmp_path / "float.h5"
    _write_raw(cases["a float perm"], np.arange(n, dtype=np.float64), n, digest)
    cases["an input file"] = tmp_path / "input.h5"
    write_matrix(cases["an input file"], CSRMatrix.from_scipy(a, symmetric=True))
    cases["a text file"] = tmp_path / "notes.txt"
    cases["a text file"].write_text("not HDF5\n")
    expected = {"another matrix": "made for another matrix",
                "another pattern": "made for another matrix",
                "an rcm ordering": "holds a 'rcm' ordering",
                "a repeated row": "not a permutation",
                "a float perm": "not a permutation",
                "an input file": "not a hisparse Cholesky ordering file",
                "a text file": "cannot read the ordering file"}
    for case, path in cases.items():
        before = path.read_bytes()
        with pytest.raises(InputError) as failure:
            analyze(a, METHOD, ordering_file=str(path))
        message = str(failure.value)
        assert str(path) in message and "operation.params.ordering_file" in message, case
        assert expected[case] in message, (case, message)
        assert path.read_bytes() == before, case  # refused, and left as it was


def test_a_run_saves_the_ordering_and_another_rank_count_reads_it(tmp_path):
    """Under the driver: 1 rank computes and saves, 3 ranks (subtree) read the file; both
    solutions against SciPy, the same factor flops, the file left as the first run wrote it."""
    a = _grid(24)
    order = tmp_path / "order.h5"
    params = {"nrhs": 1, "ordering": METHOD, "ordering_file": str(order)}
    attrs, source = {}, _input(tmp_path, a)
    for nranks, out in ((1, "first"), (3, "second")):
        cfg = write_config(tmp_path, "cholesky", params, name=f"{out}.yaml", out=out,
                           input=source, backend="cpu")
        run, arrays = run_config(tmp_path, cfg, nprocs=nranks, out=out)
        attrs[out] = run["attrs"]
        assert attrs[out]["verify_passed"]
        x, b = arrays["x"].ravel(), arrays["b"].ravel()
        np.testing.assert_allclose(x, spl.spsolve(a.tocsc(), b), rtol=1e-9, atol=1e-12)
        if nranks == 1:
            written = order.read_bytes()
    assert attrs["first"]["chol_ordering_source"] == "computed and saved"
    assert attrs["second"]["chol_ordering_source"] == "file"
    assert attrs["second"]["chol_partition"] == "subtree"
    assert attrs["second"]["chol_factor_flops"] == attrs["first"]["chol_factor_flops"]
    assert order.read_bytes() == written


def test_a_run_with_another_matrix_s_file_stops_naming_it(tmp_path):
    order = tmp_path / "order.h5"
    other = _grid(21)
    OrderingFile(order, METHOD).write(np.arange(other.shape[0]), _digest(other), METHOD)
    cfg = write_config(tmp_path, "cholesky", {"ordering": METHOD, "ordering_file": str(order)},
                       input=_input(tmp_path, _grid(20)), backend="cpu")
    proc = run_config(tmp_path, cfg, nprocs=2, expect_rc=2)
    assert str(order) in proc.stderr and "made for another matrix" in proc.stderr


def test_an_ordering_file_that_cannot_be_written_stops_the_run_before_the_input(tmp_path):
    missing = tmp_path / "no such directory" / "order.h5"
    cfg = write_config(tmp_path, "cholesky", {"ordering_file": str(missing)},
                       input={"path": str(tmp_path / "absent.h5")}, backend="cpu")
    proc = run_config(tmp_path, cfg, expect_rc=2)
    # the written file's problem, before the (missing) input is looked at
    assert "operation.params.ordering_file" in proc.stderr and "absent.h5" not in proc.stderr


def test_the_ordering_file_is_not_the_input(tmp_path):
    a = _grid()
    source = _input(tmp_path, a)
    with pytest.raises(HisparseError, match="not a hisparse Cholesky ordering file"):
        analyze(a, METHOD, ordering_file=source["path"])

"""``hisparse convert`` of a file that stores one triangle of a matrix (CSparse's triplet files
hold the lower half of a symmetric one): a note at convert time, a ``storage`` attribute, and a
Cholesky run that either works (converted with --symmetric) or says exactly what to do."""
import h5py
import scipy.sparse as sp
import yaml

from hisparse.io import one_triangle, read_matrix
from hisparse.formats import CSRMatrix

from conftest import run_hisparse


def _laplacian(n=5):
    path = sp.diags([-1.0, 2.0, -1.0], [-1, 0, 1], shape=(n, n))
    return (sp.kronsum(path, path) + sp.eye(n * n)).tocsr()  # SPD


def _triplet_file(path, matrix):
    lower = sp.tril(matrix).tocoo()
    path.write_text("".join(f"{i} {j} {float(v)!r}\n" for i, j, v in
                            zip(lower.row, lower.col, lower.data)))


def _cholesky(tmp_path, h5):
    config = tmp_path / f"{h5.stem}.yaml"
    config.write_text(yaml.safe_dump({"run": {"name": h5.stem, "repeats": 1, "warmup": 0},
                                      "operation": {"name": "cholesky"}, "backend": "cpu",
                                      "input": {"path": str(h5)},
                                      "output": {"dir": str(tmp_path / "out")}}))
    return run_hisparse(["run", config, "--quiet"], timeout=300)


def test_one_triangle_detection():
    a = _laplacian(3)
    assert one_triangle(CSRMatrix.from_scipy(sp.tril(a).tocsr())) == "lower"
    assert one_triangle(CSRMatrix.from_scipy(sp.triu(a).tocsr())) == "upper"
    assert one_triangle(CSRMatrix.from_scipy(a)) is None
    assert one_triangle(CSRMatrix.from_scipy(sp.eye(4).tocsr())) is None  # diagonal
    assert one_triangle(CSRMatrix.from_scipy(sp.tril(a).tocsr(), symmetric=True)) is None


def test_a_lower_triangle_file_is_noted_and_cholesky_says_what_to_do(tmp_path):
    a = _laplacian()
    source = tmp_path / "lap_triplet.txt"
    _triplet_file(source, a)
    lower = tmp_path / "lower.h5"
    proc = run_hisparse(["convert", source, lower, "--format", "triplet"])
    assert proc.returncode == 0, proc.stderr
    assert "hisparse: note:" in proc.stdout and "only the lower triangle is stored" in \
        proc.stdout and "--symmetric" in proc.stdout, proc.stdout
    with h5py.File(lower, "r") as handle:
        assert handle.attrs["storage"] == "lower" and not handle.attrs["symmetric"]
    proc = _cholesky(tmp_path, lower)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("hisparse: error:") and "not symmetric" in line
    assert "stores only its lower triangle" in line and "hisparse convert --symmetric" in line

    full = tmp_path / "full.h5"
    proc = run_hisparse(["convert", source, full, "--format", "triplet", "--symmetric"])
    assert proc.returncode == 0 and "note" not in proc.stdout, proc.stdout + proc.stderr
    stored = read_matrix(full)
    assert stored.symmetric and abs(stored.to_scipy() - a).max() == 0
    with h5py.File(full, "r") as handle:
        assert "storage" not in handle.attrs
    proc = _cholesky(tmp_path, full)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = (tmp_path / "out").glob("full__*.h5")
    with h5py.File(result, "r") as handle:
        assert handle.attrs["verify_passed"]

    # the same group written again with both triangles loses the stale attribute
    proc = run_hisparse(["convert", source, lower, "--format", "triplet", "--symmetric",
                         "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    with h5py.File(lower, "r") as handle:
        assert "storage" not in handle.attrs and handle.attrs["symmetric"]

"""SpMV (CSR): results against SciPy on one and several ranks, CPU and GPU."""
import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from hisparse import generators
from hisparse.io import read_results, write_matrix
from hisparse.ops.spmv import threads_per_row

from conftest import run_hisparse


def _irregular_matrix(path, seed=3):
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
    matrix = sp.csr_matrix((rng.standard_normal(len(rows)), (rows, cols)), shape=(m, n))
    from hisparse.formats import CSRMatrix
    write_matrix(path, CSRMatrix.from_scipy(matrix))
    return matrix


def _config(tmp_path, input_path, **extra):
    lines = [
        "run: {name: t, repeats: 2, warmup: 1}",
        "operation: {name: spmv, params: {x: random}}",
        f"input: {{path: {input_path}}}",
        f"output: {{dir: {tmp_path / 'out'}}}",
    ]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    path = tmp_path / "run.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _y_of(result_file):
    with h5py.File(result_file, "r") as handle:
        return handle["result/y"][()]


def test_threads_per_row_follows_mean_row_length():
    assert threads_per_row(0.5) == 1
    assert threads_per_row(5) == 4
    assert threads_per_row(27) == 32
    assert threads_per_row(1000) == 32


@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_modulo", "row_blocks"])
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_spmv_cpu_matches_scipy(tmp_path, strategy, nprocs):
    input_path = tmp_path / "a.h5"
    matrix = _irregular_matrix(input_path)
    cfg = _config(tmp_path, input_path, backend="cpu", partition=f"{{strategy: {strategy}}}")
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr
    (result_file,) = (tmp_path / "out").glob("*.h5")
    run = read_results(str(result_file))
    assert run["attrs"]["verify_passed"]
    assert run["attrs"]["nranks"] == nprocs
    x = np.random.default_rng(0).uniform(-1, 1, matrix.shape[1])
    np.testing.assert_allclose(_y_of(result_file), matrix @ x, rtol=1e-12, atol=1e-12)
    # Every rank recorded its own rows, and the parts cover the matrix.
    assert int(np.sum(run["rank_vars"]["n_rows"])) == matrix.shape[0]
    assert int(np.sum(run["rank_vars"]["nnz"])) == matrix.nnz


@pytest.mark.gpu
@pytest.mark.parametrize("precision,rtol", [("fp64", 1e-12), ("fp32", 1e-5)])
@pytest.mark.parametrize("index_width", ["int32", "int64"])
@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_spmv_gpu_matches_scipy(tmp_path, precision, rtol, index_width, nprocs):
    input_path = tmp_path / "a.h5"
    matrix = _irregular_matrix(input_path)
    cfg = _config(tmp_path, input_path, backend="gpu", precision=precision,
                  index_width=index_width)
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr
    (result_file,) = (tmp_path / "out").glob("*.h5")
    run = read_results(str(result_file))
    assert run["attrs"]["backend"] == "gpu"
    x = np.random.default_rng(0).uniform(-1, 1, matrix.shape[1])
    if precision == "fp32":
        x = x.astype(np.float32).astype(np.float64)
        reference = matrix.astype(np.float32).astype(np.float64) @ x
    else:
        reference = matrix @ x
    y = _y_of(result_file)
    assert np.max(np.abs(y - reference)) <= rtol * np.max(np.abs(reference))
    # GPU phases were timed with CUDA events.
    kernel = run["phases"].index("kernel")
    assert np.all(np.isfinite(run["gpu"][:, :, kernel]))


@pytest.mark.gpu
def test_spmv_gpu_poisson_bitwise_repeatable(tmp_path):
    input_path = tmp_path / "p.h5"
    write_matrix(input_path, generators.poisson([40, 40, 40], stencil=27))
    cfg = _config(tmp_path, input_path, backend="gpu")
    ys = []
    for _ in range(2):
        proc = run_hisparse(["run", cfg, "--quiet"], nprocs=1)
        assert proc.returncode == 0, proc.stderr
    for result_file in sorted((tmp_path / "out").glob("*.h5")):
        ys.append(_y_of(result_file))
    assert np.array_equal(ys[0], ys[1])

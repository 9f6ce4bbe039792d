"""CP-ALS: fits per iteration against a plain dense NumPy CP-ALS (Tensor Toolbox rules) written
here, on 3-, 4- and 5-order tensors, on 1/2/4 ranks, CPU and GPU, with checkpoint/resume."""
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from hisparse.formats import COOTensor
from hisparse.io import read_results, write_tensor

from conftest import run_hisparse

# Bro's amino-acid fluorescence tensor (5 x 201 x 61, dense), converted from GenTen's
# aminoacid_data.txt.gz with `hisparse convert` and shipped in inputs/.
AMINO_H5 = Path(__file__).resolve().parents[1] / "inputs" / "aminoacid.h5"


# -- the oracle: dense CP-ALS with the Tensor Toolbox rules, written plainly -------------------

def dense_mttkrp(dense, factors, n):
    """X_(n) times the Khatri-Rao product of the other factors, by einsum on the dense array."""
    order = dense.ndim
    operands = [dense, list(range(order))]
    for m in range(order):
        if m != n:
            operands += [factors[m], [m, order]]
    return np.einsum(*operands, [n, order])


def dense_model(lam, factors):
    order = len(factors)
    operands = [lam, [order]]
    for m, factor in enumerate(factors):
        operands += [factor, [m, order]]
    return np.einsum(*operands, list(range(order)))


def oracle_cp_als(dense, init, tol, max_iters):
    """Fits per iteration; the residual norm is taken on the dense model itself."""
    factors = [np.array(f, dtype=np.float64) for f in init]
    rank = factors[0].shape[1]
    norm_x = np.linalg.norm(dense)
    fits, fit = [], 0.0
    for iteration in range(max_iters):
        fit_old = fit
        for n in range(dense.ndim):
            gram_product = np.ones((rank, rank))
            for m in range(dense.ndim):
                if m != n:
                    gram_product *= factors[m].T @ factors[m]
            unew = np.linalg.solve(gram_product.T, dense_mttkrp(dense, factors, n).T).T
            if iteration == 0:
                lam = np.linalg.norm(unew, axis=0)
            else:
                lam = np.maximum(np.abs(unew).max(axis=0), 1.0)
            factors[n] = unew / lam
        fit = 1.0 - np.linalg.norm(dense - dense_model(lam, factors)) / norm_x
        fits.append(fit)
        if iteration > 0 and abs(fit - fit_old) < tol:
            break
    return np.array(fits), lam, factors


# -- problems ----------------------------------------------------------------------------------

def sparse_tensor(dims, nnz, seed, empty_slice=True):
    """Random sparse tensor with distinct coordinates; one index of mode 0 left empty."""
    rng = np.random.default_rng(seed)
    size = int(np.prod(dims))
    linear = rng.choice(size, size=nnz, replace=False)
    coords = np.stack(np.unravel_index(linear, dims), axis=1).astype(np.int64)
    if empty_slice:
        coords = coords[coords[:, 0] != 1]
    values = rng.uniform(0.1, 1.0, size=len(coords))
    dense = np.zeros(dims)
    dense[tuple(coords.T)] = values
    return COOTensor(coords, values, tuple(dims)), dense


def write_problem(tmp_path, dims, nnz, rank, seed=0):
    tensor, dense = sparse_tensor(dims, nnz, seed)
    write_tensor(str(tmp_path / "x.h5"), tensor, mode="w")
    rng = np.random.default_rng(seed + 100)
    init = [rng.uniform(0.0, 1.0, size=(d, rank)) for d in dims]
    with h5py.File(tmp_path / "init.h5", "w") as handle:
        for m, factor in enumerate(init):
            handle.create_dataset(f"factor_{m}", data=factor)
    return dense, init


def config(tmp_path, params, name="run.yaml", out="out", **extra):
    import yaml
    data = {"run": {"name": "t", "repeats": 1, "warmup": 0},
            "operation": {"name": "cpals", "params": params},
            "input": {"path": str(tmp_path / "x.h5")},
            "output": {"dir": str(tmp_path / out)}}
    data.update(extra)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def run_fits(tmp_path, params, nprocs=1, out="out", **extra):
    cfg = config(tmp_path, params, name=f"{out}.yaml", out=out, **extra)
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=nprocs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = (tmp_path / out).glob("*.h5")
    with h5py.File(result_file, "r") as handle:
        arrays = {k: handle["result"][k][()] for k in handle["result"]}
    return read_results(str(result_file)), arrays


def params_for(tmp_path, rank, tol=1e-6, max_iters=60, **more):
    return dict({"rank": rank, "tol": tol, "max_iters": max_iters,
                 "init": str(tmp_path / "init.h5")}, **more)


PROBLEMS = {3: ([9, 11, 13], 300, 4), 4: ([6, 7, 8, 5], 400, 3), 5: ([5, 6, 4, 5, 4], 500, 3)}


# -- CPU ---------------------------------------------------------------------------------------

def test_numpy_mttkrp_on_unfolding_blocks_matches_dense():
    from hisparse.ops._cpals_engines import numpy_mttkrp
    from hisparse.ops._cpals_format import mode_unfolding, partition_mode
    tensor, dense = sparse_tensor([7, 5, 6, 4], 200, seed=4)
    rng = np.random.default_rng(1)
    factors = [rng.standard_normal((d, 3)) for d in dense.shape]
    for n in range(4):
        csr = mode_unfolding(tensor, n)
        expected = dense_mttkrp(dense, factors, n)
        np.testing.assert_allclose(numpy_mttkrp(csr, factors, 3, chunk=17), expected,
                                   rtol=1e-12, atol=1e-12)
        blocks = partition_mode(csr, 3, "nnz_balanced")
        stacked = np.concatenate([numpy_mttkrp(b, factors, 3) for b in blocks])
        np.testing.assert_allclose(stacked, expected, rtol=1e-12, atol=1e-12)
        assert [b.row_offset for b in blocks] == sorted(b.row_offset for b in blocks)


@pytest.mark.parametrize("order", [3, 4, 5])
def test_cpals_cpu_fits_match_dense_numpy(tmp_path, order):
    dims, nnz, rank = PROBLEMS[order]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=order)
    expected, lam, factors = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank), backend="cpu")
    assert run["attrs"]["verify_passed"]
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
    # The stored model (arranged: unit columns, sorted weights) reproduces the oracle's model.
    model = dense_model(arrays["lambda"], [arrays[f"factor_{m}"] for m in range(order)])
    np.testing.assert_allclose(model, dense_model(lam, factors), rtol=0,
                               atol=1e-8 * np.abs(dense).max())
    assert np.all(np.diff(arrays["lambda"]) <= 0)


@pytest.mark.parametrize("nprocs", [2, 4])
@pytest.mark.parametrize("strategy", ["nnz_balanced", "row_blocks"])
def test_cpals_cpu_ranks_give_the_same_fits(tmp_path, nprocs, strategy):
    dims, nnz, rank = PROBLEMS[4]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=11)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank), nprocs=nprocs, backend="cpu",
                           partition={"strategy": strategy})
    assert run["attrs"]["nranks"] == nprocs
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)
    # Every rank owns a block of every mode's rows; together they cover all nonzeros N times.
    assert int(np.sum(run["rank_vars"]["nnz"])) == 4 * int(np.count_nonzero(dense))


def test_cpals_resume_after_kill_matches_uninterrupted(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=21)
    _, whole = run_fits(tmp_path, params_for(tmp_path, rank, tol=1e-7), out="whole",
                        backend="cpu")
    assert len(whole["fit"]) > 8
    checkpoint = tmp_path / "ck.h5"
    params = params_for(tmp_path, rank, tol=1e-7, checkpoint_every=3, checkpoint=str(checkpoint))
    killed = config(tmp_path, params, name="killed.yaml", out="killed", backend="cpu",
                    debug={"fail_rank": 0, "fail_phase": "iteration", "fail_iteration": 7,
                           "fail_mode": "kill"})
    proc = run_hisparse(["run", killed, "--quiet"])
    assert proc.returncode != 0
    assert not list((tmp_path / "killed").glob("*.h5"))  # it really died before the end
    with h5py.File(checkpoint, "r") as handle:
        assert handle.attrs["iteration"] == 6
    # Resume through the CLI flag, as a user would after a crash.
    cfg = config(tmp_path, params, name="resumed.yaml", out="resumed", backend="cpu")
    proc = run_hisparse(["run", cfg, "--quiet", "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = (tmp_path / "resumed").glob("*.h5")
    with h5py.File(result_file, "r") as handle:
        resumed = {k: handle["result"][k][()] for k in handle["result"]}
    assert len(resumed["fit"]) == len(whole["fit"])
    np.testing.assert_allclose(resumed["fit"], whole["fit"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(resumed["lambda"], whole["lambda"], rtol=1e-10)


def test_cpals_nvecs_init_uses_leading_singular_vectors(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    dense, _ = write_problem(tmp_path, dims, nnz, rank, seed=5)
    init = []
    for n in range(3):
        unfolding = np.moveaxis(dense, n, 0).reshape(dims[n], -1)
        left = np.linalg.svd(unfolding, full_matrices=False)[0][:, :rank]
        init.append(left)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=40)
    _, arrays = run_fits(tmp_path, params_for(tmp_path, rank, max_iters=40, init="nvecs"),
                         backend="cpu")
    # Column signs of the start do not change the fits (the models only flip signs).
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)


def test_cpals_checkpoint_needs_a_path(tmp_path):
    write_problem(tmp_path, [5, 6, 7], 50, 2)
    cfg = config(tmp_path, {"rank": 2, "checkpoint_every": 2}, backend="cpu")
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode != 0
    assert "operation.params.checkpoint" in proc.stderr


def _amino_path(tmp_path):
    return AMINO_H5


@pytest.mark.parametrize("backend", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_cpals_aminoacid_rank3_fit(tmp_path, backend):
    path = _amino_path(tmp_path)
    cfg = tmp_path / "amino.yaml"
    cfg.write_text("run: {name: amino, repeats: 1, warmup: 0, seed: 3}\n"
                   "operation: {name: cpals, params: {rank: 3, tol: 1.0e-6, max_iters: 100}}\n"
                   f"input: {{path: {path}}}\noutput: {{dir: {tmp_path / 'out'}}}\n"
                   f"backend: {backend}\n")
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result_file,) = (tmp_path / "out").glob("*.h5")
    run = read_results(str(result_file))
    assert run["attrs"]["verify_passed"]
    assert run["attrs"]["final_fit"] > 0.9


# -- GPU ---------------------------------------------------------------------------------------

@pytest.fixture
def gpu_context():
    from hisparse.gpu import bind_device
    device = bind_device(0)
    yield device
    device.release()


def _engine(tensor, rank, kernel, dtype, chunk=None):
    from mpi4py import MPI
    from hisparse.gpu import load_module
    from hisparse.ops._cpals_engines import GpuEngine
    from hisparse.ops._cpals_format import mode_unfolding
    local = [mode_unfolding(tensor, n, np.int32) for n in range(tensor.order)]
    ctx = SimpleNamespace(comm=MPI.COMM_WORLD, value_dtype=np.dtype(dtype),
                          load_kernels=lambda name, defines: load_module(name, defines))
    engine = GpuEngine(ctx, local, tensor.shape, rank, kernel=kernel, chunk=chunk)
    engine.upload()
    return engine


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["seed", "fast"])
@pytest.mark.parametrize("dims,rank", [([40, 3, 30], 16), ([9, 8, 7, 6], 5),
                                       ([7, 6, 5, 4, 6], 40)])
@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-12), (np.float32, 1e-4)])
def test_gpu_mttkrp_kernels_match_dense(gpu_context, kernel, dims, rank, dtype, rtol):
    # Few rows in mode 1 (long rows that span many chunks) and an empty slice of mode 0.
    tensor, dense = sparse_tensor(dims, min(int(np.prod(dims)) // 2, 2000), seed=len(dims))
    rng = np.random.default_rng(2)
    factors = [rng.uniform(-1, 1, size=(d, rank)) for d in dims]
    engine = _engine(tensor, rank, kernel, dtype, chunk=32)
    try:
        engine.load([f.astype(dtype) for f in factors])
        for n in range(len(dims)):
            engine.mttkrp(n)
            expected = dense_mttkrp(dense, factors, n)
            got = engine.local_mttkrp(n)
            scale = np.abs(expected).max()
            assert np.abs(got - expected).max() <= rtol * scale * 10
    finally:
        engine.free()


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["seed", "fast"])
@pytest.mark.parametrize("nprocs", [1, 2])
@pytest.mark.parametrize("order", [3, 5])
def test_cpals_gpu_fits_match_dense_numpy(tmp_path, kernel, nprocs, order):
    dims, nnz, rank = PROBLEMS[order]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=order + 30)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=60)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, mttkrp=kernel), nprocs=nprocs,
                           backend="gpu")
    assert run["attrs"]["backend"] == "gpu"
    assert run["attrs"]["mttkrp_kernel"] == ("mttkrp_row_block" if kernel == "seed"
                                             else "mttkrp_nnz_team")
    assert len(arrays["fit"]) == len(expected)
    np.testing.assert_allclose(arrays["fit"], expected, rtol=0, atol=1e-9)


@pytest.mark.gpu
def test_cpals_gpu_fp32_and_cusparse_peer(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    dense, init = write_problem(tmp_path, dims, nnz, rank, seed=41)
    expected, _, _ = oracle_cp_als(dense, init, tol=1e-6, max_iters=20)
    run, arrays = run_fits(tmp_path, params_for(tmp_path, rank, max_iters=20), backend="gpu",
                           precision="fp32", peers=["cusparse"])
    assert run["attrs"]["verify_passed"]
    np.testing.assert_allclose(arrays["fit"][:5], expected[:5], rtol=0, atol=1e-4)
    peer = run["peers"]["cusparse"]
    if "skipped" not in peer:
        assert peer["max_rel_diff_vs_ours"] < 1e-4

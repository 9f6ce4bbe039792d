"""``hisparse run``'s start: the package imports light (CUDA's initialisation starts before NumPy
and the rest are imported), the background warm-up pairs its primary-context retain with a
release (checked against a stand-in driver library built here), and the look-ahead at the
backend."""
import argparse
import os
import shutil
import subprocess
import sys

import pytest

from hisparse.cli import _backend_asked, _start_cuda_warmup
from hisparse.gpu._warmup import CudaWarmup
from hisparse.parallel._launcher import guess_local_rank

FAKE_DRIVER = r"""
static int inits, retains, releases;
int cuInit(unsigned flags) { inits++; return flags == 0 ? 0 : 1; }
int cuDeviceGetCount(int *count) { *count = 2; return 0; }
int cuDeviceGet(int *device, int ordinal) { *device = 100 + ordinal; return 0; }
int cuDevicePrimaryCtxRetain(void **context, int device) { retains++; *context = (void *)0x10; return 0; }
int cuDevicePrimaryCtxRelease_v2(int device) { releases++; return 0; }
int counts(int which) { return which == 0 ? inits : which == 1 ? retains : releases; }
"""


def _shared_library(directory, name, source):
    """``lib<name>.so`` built from C ``source`` in ``directory`` (skips without a compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler for the stand-in driver library")
    (directory / f"{name}.c").write_text(source)
    library = directory / f"lib{name}.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library),
                    str(directory / f"{name}.c")], check=True)
    return str(library)


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    return _shared_library(tmp_path_factory.mktemp("driver"), "fakecuda", FAKE_DRIVER)


def test_warmup_retains_the_ranks_device_once_and_releases_it(fake_driver):
    import ctypes
    counts = ctypes.CDLL(fake_driver).counts  # the same library the warm-up loads

    def since(before):
        return tuple(counts(i) - before[i] for i in range(3))

    before = tuple(counts(i) for i in range(3))
    warm = CudaWarmup(local_rank=3, library=fake_driver)
    warm.thread.join()
    assert warm.retained and warm.ordinal == 1  # rank 3 on 2 devices: the driver's rule
    assert since(before) == (1, 1, 0)  # initialised, retained, not yet released
    warm.finish()
    warm.finish()  # idempotent: one release only
    assert not warm.retained and since(before) == (1, 1, 1)


def test_warmup_without_a_driver_or_a_rank_ends_quietly(fake_driver, tmp_path):
    missing = CudaWarmup(local_rank=0, library=str(tmp_path / "libnothing.so"))
    missing.finish()
    assert not missing.retained
    driver_only = CudaWarmup(local_rank=None, library=fake_driver)
    driver_only.finish()
    assert not driver_only.retained and driver_only.ordinal is None


def test_warmup_with_a_partial_driver_ends_quietly(tmp_path, monkeypatch):
    """A library with cuInit alone (no device entry points): the thread ends without an
    exception reaching the thread hook, holding nothing."""
    import threading
    library = _shared_library(tmp_path, "partial", "int cuInit(unsigned flags) { return 0; }\n")
    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    warm = CudaWarmup(local_rank=0, library=library)
    warm.finish()
    assert not warm.retained and not escaped


def test_local_rank_guess(monkeypatch):
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID",
                 "SLURM_STEP_ID", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    assert guess_local_rank(launched=False) == 0
    assert guess_local_rank(launched=True) is None
    monkeypatch.setenv("SLURM_LOCALID", "0")
    assert guess_local_rank(launched=True) is None  # SLURM_LOCALID outside an srun step
    monkeypatch.setenv("SLURM_STEP_ID", "4")
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert guess_local_rank(launched=True) == 2
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "5")
    assert guess_local_rank(launched=True) == 5


def test_backend_look_ahead(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text("backend: cpu\nrun: {repeats: 1}\n")
    args = argparse.Namespace(config=str(config), set=None)
    assert _backend_asked(args) == "cpu"
    args.set = ["backend=gpu", "run.repeats=2"]
    assert _backend_asked(args) == "gpu"  # the override wins
    config.write_text("run: {repeats: 1}\n")
    assert _backend_asked(argparse.Namespace(config=str(config), set=None)) == "auto"
    config.write_text("backend: [unclosed\n")
    assert _backend_asked(argparse.Namespace(config=str(config), set=None)) is None
    # a CPU run starts nothing
    config.write_text("backend: cpu\n")
    monkeypatch.delenv("HISPARSE_MPI", raising=False)
    assert _start_cuda_warmup(argparse.Namespace(config=str(config), set=None)) is None


@pytest.mark.parametrize("backend", ["gpu", "auto"])
def test_every_launched_rank_warms_its_own_device(tmp_path, monkeypatch, backend):
    """Under a launcher every rank reads the config's backend ahead and, knowing its node-local
    rank, makes that device's context in the background, not only the driver."""
    config = tmp_path / "run.yaml"
    config.write_text(f"backend: {backend}\n")
    monkeypatch.delenv("HISPARSE_MPI", raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    warm = _start_cuda_warmup(argparse.Namespace(config=str(config), set=None))
    try:
        assert warm is not None and warm.local_rank == 3
    finally:
        warm.finish()  # (no driver here: the thread ended quietly; on a GPU host, released)


def test_main_starts_the_warmup_before_numpy(tmp_path):
    """``hisparse run`` starts CUDA's initialisation before the signal guard's module imports
    NumPy: what was imported when the warm-up started, seen from inside it."""
    config = tmp_path / "run.yaml"
    config.write_text("backend: gpu\nrun: {repeats: 1}\n")
    code = (
        "import sys, hisparse.cli as cli\n"
        "seen = []\n"
        "class Stop(Exception): pass\n"
        "def warm(args):\n"
        "    seen.append('numpy' in sys.modules)\n"
        "    raise Stop\n"
        "cli._start_cuda_warmup = warm\n"
        "try:\n"
        f"    cli.main(['run', {str(config)!r}])\n"
        "except Stop:\n"
        "    pass\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ))
    assert out.stdout.strip() == "[False]"


def test_cli_imports_neither_numpy_nor_mpi_before_the_command():
    code = ("import sys, hisparse.cli, hisparse.gpu._warmup, hisparse.parallel._launcher; "
            "print(sorted(m for m in ('numpy', 'h5py', 'mpi4py', 'scipy', 'pycuda') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ))
    assert out.stdout.strip() == "[]"


def test_lazy_names_resolve_to_their_modules():
    import hisparse
    import hisparse.formats
    import hisparse.gpu
    import hisparse.parallel
    assert hisparse.CSRMatrix is hisparse.formats.CSRMatrix
    assert hisparse.io.read_results.__module__.startswith("hisparse.io")
    assert hisparse.gpu.select_device_ordinal(5, 2) == 1
    assert hisparse.parallel.get_world.__module__ == "hisparse.parallel._mpi"
    for package in (hisparse, hisparse.gpu, hisparse.parallel):
        with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
            package.nothing_here


def test_numba_is_imported_at_the_first_compiled_call_not_before():
    """Importing the driver, the formats, the generators and the operations' modules leaves
    Numba out (~0.3 s of start-up); calling a compiled function brings it in."""
    code = ("import sys, hisparse.driver, hisparse.formats, hisparse.generators, "
            "hisparse.ops.spmv.reference, hisparse.ops.spgemm.reference, "
            "hisparse.ops.cholesky.symbolic; before = 'numba' in sys.modules; "
            "import numpy as np; from hisparse.compiled import fingerprint; "
            "fingerprint(np.arange(3)); print(before, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ))
    assert out.stdout.split() == ["False", "True"]


def test_the_cholesky_operation_leaves_scipy_linalg_to_its_cpu_engine():
    """Importing the Cholesky operation (every rank's start-up) leaves SciPy's dense linear
    algebra out (0.17 s); the CPU engine's first factorization brings it in."""
    code = ("import sys, hisparse.ops.cholesky.op; before = 'scipy.linalg' in sys.modules; "
            "from hisparse.ops.cholesky.cpu import _dense_kernels; import numpy as np; "
            "_dense_kernels(np.float64); print(before, 'scipy.linalg' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env=dict(os.environ))
    assert out.stdout.split() == ["False", "True"]

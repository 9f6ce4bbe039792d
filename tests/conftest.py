"""Test plumbing: the ``gpu`` marker, the ``parallel`` marker (run a test under mpiexec), and
helpers that launch ``hisparse`` under mpiexec with a timeout.

- ``@pytest.mark.gpu``: skipped unless PyCUDA imports and a CUDA device is visible.
- ``@pytest.mark.parallel(nprocs=[2, 4])``: the test takes an ``nprocs`` argument; the outer
  pytest re-runs that single test under ``mpiexec -n nprocs`` (with a timeout, so a hang fails
  instead of blocking CI) and passes if every rank passes. Inside, ``MPI.COMM_WORLD.size ==
  nprocs``. Make assertions collective (``comm.allreduce(ok, op=MPI.LAND)``) so one failing rank
  cannot strand the others.
"""
import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

try:
    # In-process tests share one initialised MPI world, as before hisparse ran without MPI when
    # no launcher started it (its serial world: tests/test_serial_comm.py); the `hisparse run`
    # subprocesses started without mpiexec take that serial world.
    from mpi4py import MPI  # noqa: F401
except ImportError:
    pass

ROOT = Path(__file__).resolve().parents[1]
INSIDE_MPI = "HISPARSE_PYTEST_MPI"
MPI_TIMEOUT = int(os.environ.get("HISPARSE_MPI_TEST_TIMEOUT", "180"))


@lru_cache(maxsize=None)
def has_gpu():
    try:
        from hisparse.gpu import gpu_available
        return gpu_available()
    except Exception:
        return False


@lru_cache(maxsize=None)
def mpiexec_command():
    """``[mpiexec, extra flags...]`` for the MPI on PATH (MPICH or Open MPI), or None."""
    exe = shutil.which("mpiexec") or shutil.which("mpirun")
    if exe is None:
        return None
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "OpenRTE" in version:
        return [exe, "--oversubscribe", "--allow-run-as-root"]
    return [exe]


#: what an MPI process of this test session (pytest itself, a pytest-xdist worker: each imports
#: mpi4py, a singleton MPI world) may have put in its environment for its own job: a launcher
#: started from it must begin a job of its own, not find the session's
_INHERITED_JOB = ("PMIX_", "PRTE_", "OMPI_COMM_WORLD", "OMPI_MCA_orte_", "OMPI_MCA_ess",
                  "OMPI_MCA_pmix", "OMPI_FILE_LOCATION", "OMPI_UNIVERSE_SIZE", "PMI_")


def mpi_env():
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(_INHERITED_JOB) or os.environ.get(INSIDE_MPI)}
    env.setdefault("MPIEXEC_TIMEOUT", str(MPI_TIMEOUT))  # MPICH's own watchdog
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_hisparse(args, nprocs=1, timeout=MPI_TIMEOUT, cwd=ROOT):
    """Run ``python -m hisparse ARGS`` (under mpiexec when nprocs > 1); returns CompletedProcess."""
    command = [sys.executable, "-m", "hisparse", *map(str, args)]
    if nprocs > 1:
        launcher = mpiexec_command()
        if launcher is None:
            pytest.skip("mpiexec not found")
        command = launcher + ["-n", str(nprocs)] + command
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=mpi_env())


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs PyCUDA and a CUDA device (skipped otherwise)")
    config.addinivalue_line("markers", "parallel(nprocs): run the test under mpiexec -n nprocs")
    config.addinivalue_line("markers", "slow: longer tests")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA device / PyCUDA")
    for item in items:
        if "gpu" in item.keywords and not has_gpu():
            item.add_marker(skip_gpu)


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker("parallel")
    if marker is not None and "nprocs" in metafunc.fixturenames:
        metafunc.parametrize("nprocs", marker.kwargs.get("nprocs", [2]))


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("parallel")
    if marker is None or os.environ.get(INSIDE_MPI):
        return
    nprocs = item.callspec.params.get("nprocs", 2) if hasattr(item, "callspec") else 2
    launcher = mpiexec_command()
    if launcher is None:
        pytest.skip("mpiexec not found")

    def run_under_mpiexec():
        env = mpi_env()
        env[INSIDE_MPI] = "1"
        command = launcher + ["-n", str(nprocs), sys.executable, "-m", "pytest", "-q", "-x",
                              "--no-header", "-p", "no:cacheprovider", "-p", "no:randomly",
                              item.nodeid]
        try:
            proc = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env,
                                  timeout=MPI_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"timed out after {MPI_TIMEOUT}s under mpiexec -n {nprocs} (hang?)\n"
                        f"{exc.stdout or ''}{exc.stderr or ''}")
        if proc.returncode != 0:
            pytest.fail(f"failed under mpiexec -n {nprocs} (rc {proc.returncode}):\n"
                        f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")

    item.runtest = run_under_mpiexec

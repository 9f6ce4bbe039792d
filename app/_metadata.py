"""Run metadata recorded in every results file: versions, git state, scheduler, environment."""
import datetime
import getpass
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata as importlib_metadata
from pathlib import Path

from ._version import __version__
from .parallel import launcher_name

_ENV_PREFIXES = ("SLURM_", "PBS_", "CUDA_", "OMPI_COMM_WORLD", "PMI_", "PMIX_RANK", "MPI_LOCAL",
                 "PALS_", "HISPARSE_", "PYCUDA_", "MPICH_", "MPIR_CVAR_")


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def _package_version(name):
    try:
        return importlib_metadata.version(name)
    except importlib_metadata.PackageNotFoundError:
        return ""


def git_state():
    """``(sha, dirty)`` of the source tree, or ``("", False)`` outside a git checkout."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if not sha:
            return "", False
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip() != ""
        return sha, dirty
    except (OSError, subprocess.SubprocessError):
        return "", False


def scheduler_info():
    """Scheduler name and job identifiers from the environment."""
    env = os.environ
    if "SLURM_JOB_ID" in env:
        return {"scheduler": "slurm", "job_id": env["SLURM_JOB_ID"],
                "array_job_id": env.get("SLURM_ARRAY_JOB_ID", ""),
                "array_task_id": env.get("SLURM_ARRAY_TASK_ID", ""),
                "job_name": env.get("SLURM_JOB_NAME", ""),
                "partition_or_queue": env.get("SLURM_JOB_PARTITION", ""),
                "cluster": env.get("SLURM_CLUSTER_NAME", "")}
    if "PBS_JOBID" in env:
        return {"scheduler": "pbs", "job_id": env["PBS_JOBID"], "array_job_id": "",
                "array_task_id": env.get("PBS_ARRAY_INDEX", ""),
                "job_name": env.get("PBS_JOBNAME", ""),
                "partition_or_queue": env.get("PBS_QUEUE", ""), "cluster": ""}
    return {"scheduler": "none", "job_id": "", "array_job_id": "", "array_task_id": "",
            "job_name": "", "partition_or_queue": "", "cluster": ""}


def environment_subset():
    return {k: v for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES)}


def run_metadata():
    """Flat metadata for the results file's root attributes (rank 0)."""
    from mpi4py import MPI
    import h5py
    sha, dirty = git_state()
    meta = {
        "app_version": __version__, "git_sha": sha, "git_dirty": dirty,
        "python_version": platform.python_version(), "cmdline": " ".join(sys.argv),
        "user": _safe_user(), "launcher": launcher_name(),
        # "serial": no launcher, so no MPI library was initialised (hisparse.parallel._serial)
        "mpi_world": "mpi" if MPI.Is_initialized() else "serial",
        "mpi_library_version": MPI.Get_library_version().splitlines()[0].strip(),
        "mpi_version": "%d.%d" % MPI.Get_version(), "hdf5_version": h5py.version.hdf5_version,
    }
    for name in ("numpy", "scipy", "h5py", "pyyaml", "mpi4py", "pycuda"):
        meta[f"{name}_version"] = _package_version(name)
    meta.update(scheduler_info())
    return meta


def _safe_user():
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def rank_identity():
    """This rank's host and process identity (gathered into ``/perf``)."""
    return {"hostname": socket.gethostname(), "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}

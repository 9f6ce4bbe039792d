"""A real Slurm: submit generated scaling studies of the quickstart (1 and 2 ranks, CPU backend)
with ``sbatch --wait``, then check every results file and the study report.

Skipped unless ``sbatch`` is on PATH and a controller answers (CI starts a one-node cluster with
``.ci/slurm-up.sh`` and stops it with ``.ci/slurm-down.sh``).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

from conftest import ROOT, mpiexec_command, run_hisparse

QUICKSTART = ROOT / "inputs" / "quickstart.yaml"


def _slurm_answers():
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                              timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = proc.stdout.split()
    return proc.returncode == 0 and any(s.rstrip("*~#") in ("idle", "mixed", "allocated")
                                        for s in states)


pytestmark = pytest.mark.skipif(not _slurm_answers(),
                                reason="no Slurm here (sbatch missing or no controller answers)")


def _env():
    bindir = str(Path(sys.executable).parent)  # the venv's mpiexec and hisparse
    return dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PYTHONUNBUFFERED="1",
                MPIEXEC_TIMEOUT="120")


def _logs(study_dir):
    return "".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                   for p in sorted((study_dir / "logs").glob("*")))


def _submit_study(tmp_path, study_id, *args):
    study_dir = tmp_path / study_id
    proc = run_hisparse(["jobs", QUICKSTART, "--study-id", study_id, "--study-dir", study_dir,
                         "--workdir", ROOT, "--ranks", "1,2", "--gpus-per-node", "0",
                         "--cpus-per-rank", "1", "--time", "00:05:00", "--signal-seconds", "30",
                         "--set", "backend=cpu", "--set", "run.repeats=3", *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    submit = study_dir / "jobs" / study_id / "submit.sh"
    proc = subprocess.run(["bash", str(submit), "--wait"], capture_output=True, text=True,
                          env=_env(), timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr + _logs(study_dir)
    return study_dir


def _check_results(study_dir, study_id):
    files = sorted(study_dir.glob("*.h5"))
    ranks = []
    for path in files:
        with h5py.File(path, "r") as handle:
            attrs = dict(handle.attrs)
        assert attrs["study"] == "strong" and attrs["study_id"] == study_id
        assert attrs["scheduler"] == "slurm" and attrs["job_id"]
        assert attrs["verify_passed"]
        ranks.append(int(attrs["nranks"]))
    assert sorted(ranks) == [1, 2], _logs(study_dir)


def _mpich():
    launcher = mpiexec_command()
    if launcher is None:
        return False
    out = subprocess.run([launcher[0], "--version"], capture_output=True, text=True).stdout
    return "HYDRA" in out


def test_strong_study_chain_under_srun_and_report(tmp_path):
    """srun_mpi: auto (the default): the job finds the mpich wheel and runs srun --mpi=pmi2, so
    the 2-rank run is one world of 2 (a mismatched plugin would stop each task with an error)."""
    if not _mpich():
        pytest.skip("srun --mpi=pmi2 is set up here for MPICH (the mpich wheel)")
    study_dir = _submit_study(tmp_path, "chain", "--launcher", "srun")
    _check_results(study_dir, "chain")

    out = tmp_path / "report"
    proc = run_hisparse(["report", study_dir, "--output", out], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = lines[0].split()
    assert header[:2] == ["study_id", "study"] and "speedup" in header and "efficiency" in header
    rows = [dict(zip(header, line.split())) for line in lines[2:4]]
    assert [r["nranks"] for r in rows] == ["1", "2"]
    assert rows[0]["speedup"] == "1" and rows[0]["efficiency"] == "1"
    assert "warning" not in proc.stderr  # the study spec's rank counts are all there
    assert (out / "study.csv").read_text().count("\n") == 3
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "plots skipped: matplotlib is not installed" in proc.stderr
    else:
        for name in ("scaling.png", "phases.png"):
            assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_strong_study_array_under_mpiexec_in_the_allocation(tmp_path):
    study_dir = _submit_study(tmp_path, "array", "--launcher", "mpiexec", "--mode", "array")
    _check_results(study_dir, "array")
    logs = sorted(p.name for p in (study_dir / "logs").glob("*.out"))
    assert len(logs) == 2 and all(name.startswith("hs-array-") for name in logs)

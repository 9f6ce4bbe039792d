"""Shared test helpers: write a run config (``yaml.safe_dump``), run it (in-process or under
mpiexec), and read back the results file and its ``/result`` arrays.

Every test that drives ``hisparse run`` builds its config here, so the config shape lives in one
place::

    cfg = write_config(tmp_path, "spmv", {"x": "ones"}, input={"path": str(h5)}, backend="cpu")
    run, arrays = run_config(tmp_path, cfg, nprocs=2)
"""
import copy

import h5py
import yaml

from hisparse.io import read_results

from conftest import run_hisparse

BASE_RUN = {"name": "t", "repeats": 2, "warmup": 1}


def config_dict(tmp_path, operation, params=None, out="out", run=None, **sections):
    """The config mapping: ``operation`` with ``params``, results under ``tmp_path/out``, and
    any other top-level sections (``input={...}``, ``backend="cpu"``, ``peers=[...]``)."""
    data = {"run": dict(BASE_RUN, **(run or {})),
            "operation": {"name": operation, "params": copy.deepcopy(params or {})},
            "output": {"dir": str(tmp_path / out)}}
    for key, value in sections.items():
        data[key] = copy.deepcopy(value)
    return data


def write_config(tmp_path, operation, params=None, name="run.yaml", out="out", run=None,
                 **sections):
    """Write :func:`config_dict`'s mapping as YAML to ``tmp_path/name``; returns the path."""
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config_dict(tmp_path, operation, params, out, run,
                                               **sections)))
    return path


def results_in(directory):
    """The one results file in ``directory`` (asserts there is exactly one)."""
    files = sorted(directory.glob("*.h5"))
    assert len(files) == 1, f"expected one results file in {directory}, found {files}"
    return files[0]


def read_run(path):
    """``(read_results(path), {name: array} of /result)``."""
    with h5py.File(path, "r") as handle:
        arrays = {k: handle["result"][k][()] for k in handle.get("result", {})}
    return read_results(str(path)), arrays


def run_config(tmp_path, config_path, nprocs=1, out="out", extra_args=(), expect_rc=0):
    """Run ``hisparse run CONFIG`` (under mpiexec when ``nprocs > 1``) and read its results.

    Returns ``(run, arrays)`` when the run is expected to succeed, else the CompletedProcess.
    """
    proc = run_hisparse(["run", config_path, "--quiet", *extra_args], nprocs=nprocs)
    assert proc.returncode == expect_rc, proc.stderr[-4000:]
    if expect_rc != 0:
        return proc
    return read_run(results_in(tmp_path / out))

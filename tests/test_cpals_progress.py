"""CP-ALS stays responsive and says what it does (issue 35 items 7 and 10): a line per iteration
and the outcome on rank 0, the walltime signal (SIGUSR1) and SIGTERM heard between iterations of
an ALS with ``max_iters: 1e14``, and a CP rank no tensor of the input's shape can need refused
before anything is allocated (a rank whose factors cannot fit the host: tests/test_estimate.py)."""
import os

import numpy as np
import pytest

from hisparse.formats import COOTensor
from hisparse.io import write_tensor

from test_cpals import PROBLEMS, config, one_error_line, params_for, write_problem
from conftest import run_hisparse
from helpers import read_run, results_in, write_config


def with_run(tmp_path, params, run):
    """A cpals config on ``tmp_path/x.h5`` on the CPU with these ``run`` settings."""
    return write_config(tmp_path, "cpals", params, run=run, backend="cpu",
                        input={"path": str(tmp_path / "x.h5")})


def test_cpals_prints_a_line_per_iteration_and_its_outcome(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=3)
    cfg = with_run(tmp_path, params_for(tmp_path, rank, tol=1e-4, max_iters=60),
                   {"repeats": 1, "warmup": 1, "progress": True})
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, arrays = read_run(results_in(tmp_path / "out"))
    fits, attrs = arrays["fit"], run["attrs"]
    assert attrs["converged"] and attrs["iterations"] == len(fits) < 60
    assert attrs["final_fit"] == fits[-1] and not attrs["stopped_by_signal"]
    lines = proc.stderr.splitlines()
    # The warm-up and the timed repeat each report their first and last iteration at least.
    for label in ("warm-up 1/1: ", "repeat 1/1: "):
        mine = [line for line in lines if label + "iteration" in line]
        assert f"{label}iteration 1: fit {fits[0]:.6f}," in mine[0], mine
        assert f"{label}iteration {len(fits)}: fit {fits[-1]:.6f} (change " in mine[-1], mine
        assert mine[-1].endswith("per iteration")
    outcome = [line for line in lines if "CP-ALS: final fit" in line]
    assert len(outcome) == 1
    assert f"final fit {fits[-1]:.6f} after {len(fits)} iterations, converged" in outcome[0]


def test_cpals_progress_off_prints_no_iteration(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=3)
    cfg = with_run(tmp_path, params_for(tmp_path, rank, max_iters=5),
                   {"repeats": 1, "warmup": 0, "progress": False})
    proc = run_hisparse(["run", cfg, "--quiet"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ": iteration" not in proc.stderr and "CP-ALS: final fit" in proc.stderr


@pytest.mark.parametrize("tol", [0.0, 1e-300])  # fits read per window / after every iteration
def test_cpals_walltime_signal_ends_an_endless_als_with_its_results(tmp_path, tol):
    """``max_iters: 1e14``: SIGUSR1 on rank 1 after iteration 9 ends the ALS on both ranks after
    that iteration; the run writes its 9 fits, verified against 9 reference iterations."""
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=7)
    cfg = config(tmp_path, params_for(tmp_path, rank, tol=tol, max_iters=10 ** 14),
                 backend="cpu", debug={"fail_rank": 1, "fail_phase": "iteration",
                                       "fail_iteration": 9, "fail_mode": "sigusr1"})
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=2, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, arrays = read_run(results_in(tmp_path / "out"))
    assert len(arrays["fit"]) == 9 and run["attrs"]["verify_passed"]
    assert run["attrs"]["stopped_by_signal"] and not run["attrs"]["converged"]
    assert "after 9 iterations, stopped by the walltime signal" in proc.stderr


def test_cpals_sigterm_ends_an_endless_als_on_every_rank_writing_nothing(tmp_path):
    dims, nnz, rank = PROBLEMS[3]
    write_problem(tmp_path, dims, nnz, rank, seed=7)
    cfg = config(tmp_path, params_for(tmp_path, rank, tol=0.0, max_iters=10 ** 14),
                 backend="cpu", debug={"fail_rank": 0, "fail_phase": "iteration",
                                       "fail_iteration": 4, "fail_mode": "sigterm"})
    proc = run_hisparse(["run", cfg, "--quiet"], nprocs=2, timeout=120)
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    assert "CP-ALS iteration" in proc.stderr and "Traceback" not in proc.stderr
    out = tmp_path / "out"
    assert not out.exists() or os.listdir(out) == []


def test_cpals_rank_above_what_the_shape_allows_is_refused_naming_the_key(tmp_path):
    """20 x 30 x 10: no tensor of that shape has rank above min(300, 200, 600) = 200 (rank 1000
    passes the generic memory estimate; rank 1e8 is refused by it before the input is read)."""
    rng = np.random.default_rng(0)
    coords = np.unique(np.stack([rng.integers(0, d, 300) for d in (20, 30, 10)], axis=1), axis=0)
    write_tensor(str(tmp_path / "x.h5"), COOTensor(coords, rng.uniform(size=len(coords)),
                                                   (20, 30, 10)), mode="w")
    proc = run_hisparse(["run", config(tmp_path, {"rank": 1000, "init": "random"},
                                       backend="cpu"), "--quiet"], timeout=60)
    one_error_line(proc, "operation.params.rank", "1000 exceeds 200")

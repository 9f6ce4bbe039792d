"""Signals (issue 16, items 3, 4 and 10): SIGINT/SIGTERM end a run on every rank at the same
phase boundary with no file (and no temporary file) left; SIGUSR1 anywhere writes the results of
the repeats done; Ctrl-C on ``mpiexec -n 2`` never hangs; a rank stuck in a long phase cannot
keep the job alive past the grace period."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import h5py
import numpy as np
import pytest

from hisparse.errors import Interrupted
from hisparse.io import write_results
from hisparse.parallel import install_signal_guard, remove_signal_guard

from conftest import ROOT, mpi_env, mpiexec_command, run_hisparse

QUICKSTART = ROOT / "inputs" / "quickstart.yaml"


def leftovers(directory):
    """Everything in ``directory``, hidden temporary files included."""
    return sorted(os.listdir(directory)) if directory.exists() else []


def injected_run(tmp_path, rank, phase, mode, nprocs=2):
    """The quickstart on the CPU where ``rank`` sends itself ``mode`` (a signal) in ``phase``."""
    out = tmp_path / "out"
    proc = run_hisparse(["run", QUICKSTART, "--quiet", "--set", "backend=cpu",
                         "--set", f"output.dir={out}",
                         "--set", f"debug={{fail_rank: {rank}, fail_phase: {phase}, "
                                  f"fail_mode: {mode}}}"], nprocs=nprocs, timeout=60)
    return proc, out


# -- SIGUSR1: the results of the repeats done, wherever it arrives -------------------------------

@pytest.mark.parametrize("rank,phase,done,stopped_at", [
    (1, "read", 0, "read"),          # before the repeat loop (MPICH's handler used to swallow it)
    (0, "partition", 0, "setup"),
    (1, "compute", 1, "repeats"),
    (0, "verify", 5, "peers"),       # verification still runs; the peers are skipped
])
def test_usr1_anywhere_writes_the_results_of_the_repeats_done(tmp_path, rank, phase, done,
                                                              stopped_at):
    proc, out = injected_run(tmp_path, rank, phase, "sigusr1")
    assert proc.returncode == 0, proc.stderr
    (path,) = out.glob("*.h5")
    assert leftovers(out) == [path.name]
    with h5py.File(path, "r") as handle:
        attrs = handle.attrs
        assert int(attrs["repeats"]) == done and attrs["stopped_at"] == stopped_at
        assert bool(attrs["stopped_early"]) == (done < 5)
        assert bool(attrs["verify_enabled"]) == (done > 0) and attrs["verify_passed"]
        # Setup phases are kept even with no timed repeat; peers were skipped with a reason.
        wall = handle["perf/wall_seconds"][()]
        assert wall.shape[:2] == (max(done, 1), 2)
        phases = [p.decode() if isinstance(p, bytes) else p for p in handle["perf/phase"][()]]
        assert np.all(wall[0, :, phases.index("read")] >= 0)
        assert "stopped" in str(handle["peers/scipy"].attrs["skipped"])
        if done:
            assert "y" in handle["result"]


def test_results_with_no_repeat_are_reported(tmp_path):
    proc, out = injected_run(tmp_path, 0, "read", "sigusr1", nprocs=1)
    assert proc.returncode == 0, proc.stderr
    report = run_hisparse(["report", out])
    assert report.returncode == 0 and "spmv" in report.stdout, report.stderr


# -- SIGTERM / SIGINT: every rank leaves together, nothing written -------------------------------

@pytest.mark.parametrize("rank,phase,mode", [
    (1, "read", "sigterm"),
    (0, "partition", "sigint"),
    (1, "compute", "sigterm"),
    (1, "verify", "sigterm"),        # rank 1 waits while rank 0 verifies
    (0, "peers", "sigint"),
    (0, "write", "sigterm"),         # rank 0 is about to write: no file, no temporary
])
def test_term_and_int_end_every_rank_at_a_boundary_with_nothing_written(tmp_path, rank, phase,
                                                                        mode):
    start = time.monotonic()
    proc, out = injected_run(tmp_path, rank, phase, mode)
    signum = getattr(signal, mode.upper())
    assert proc.returncode == 128 + signum, proc.stderr
    assert f"interrupted by {mode.upper()}" in proc.stderr and "nothing written" in proc.stderr
    assert "MPI_Abort" not in proc.stderr and "Traceback" not in proc.stderr
    assert leftovers(out) == []
    assert time.monotonic() - start < 45


# -- Ctrl-C on mpiexec -n 2 ----------------------------------------------------------------------

def _start_endless_run(out):
    command = mpiexec_command() + ["-n", "2", sys.executable, "-m", "hisparse", "run",
                                   str(QUICKSTART), "--quiet", "--set", "backend=cpu",
                                   "--set", "run.repeats=100000000", "--set", "peers=[]",
                                   "--set", f"output.dir={out}"]
    # Its own session: SIGINT to its process group is what a terminal's Ctrl-C sends.
    return subprocess.Popen(command, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_ctrl_c_ends_a_two_rank_run_within_ten_seconds_every_time(tmp_path):
    if mpiexec_command() is None:
        pytest.skip("mpiexec not found")
    for attempt in range(4):
        out = tmp_path / f"try{attempt}"
        proc = _start_endless_run(out)
        try:
            for line in proc.stdout:  # the timed repeats have started on both ranks
                if "repeat " in line:
                    break
            time.sleep(0.1 * attempt)  # land in different places of the loop
            sent = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
            output = proc.communicate(timeout=10)[0]
            elapsed = time.monotonic() - sent
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"attempt {attempt}: still running 10 s after Ctrl-C (hang)")
        assert proc.returncode == 130, output
        assert "interrupted by SIGINT" in output and elapsed < 10
        assert leftovers(out) == []


# -- the grace period: a rank that cannot reach a boundary does not keep the job alive -----------

STUCK_RANK = textwrap.dedent("""
    import os, signal, sys, time
    from hisparse.parallel import install_signal_guard
    guard = install_signal_guard(grace=1.0)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    with guard.collective(comm):
        if comm.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)          # a long phase: no boundary in sight
        comm.Barrier()              # rank 0 waits for rank 1 in a collective
    print("not reached")
""")


def test_a_rank_stuck_after_sigterm_is_aborted_after_the_grace_period(tmp_path):
    launcher = mpiexec_command()
    if launcher is None:
        pytest.skip("mpiexec not found")
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_RANK)
    start = time.monotonic()
    proc = subprocess.run(launcher + ["-n", "2", sys.executable, str(script)], cwd=ROOT,
                          env=mpi_env(), capture_output=True, text=True, timeout=45)
    assert time.monotonic() - start < 30
    assert proc.returncode != 0 and "not reached" not in proc.stdout
    assert "did not stop together within 1 s" in proc.stderr


def test_a_single_process_stuck_after_sigint_exits_130(tmp_path):
    script = tmp_path / "stuck1.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        from hisparse.parallel import install_signal_guard
        guard = install_signal_guard(grace=0.5)
        with guard.collective(None):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(60)
    """))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 130 and time.monotonic() - start < 20, proc.stderr


# -- item 10: the temporary file is gone the moment SIGTERM arrives ------------------------------

@pytest.fixture
def guard():
    installed = install_signal_guard()
    try:
        yield installed
    finally:
        remove_signal_guard()


def _results_args():
    wall = np.ones((1, 1, 2))
    return ({"operation": "spmv"}, "x: 1", {}, ["kernel", "total"], wall, wall,
            {"hostname": ["h"]})


@pytest.mark.parametrize("deferred", [False, True])
def test_sigterm_during_the_results_write_leaves_no_temporary(tmp_path, monkeypatch, guard,
                                                             deferred):
    """Outside a run SIGTERM raises at once; inside a run (deferred) the write goes on, but the
    handler has deleted the temporary file already and nothing is published."""
    import hisparse.io._results as results
    seen = {}
    write_content = results._write_content

    def write_then_signal(handle, *args):
        write_content(handle, *args)
        seen["temporary"] = handle.filename
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(200):  # the watcher thread deletes it while we are still writing
            if not os.path.exists(handle.filename):
                break
            time.sleep(0.01)
        seen["deleted_while_writing"] = not os.path.exists(handle.filename)

    monkeypatch.setattr(results, "_write_content", write_then_signal)
    path = tmp_path / "r.h5"
    with pytest.raises(Interrupted) as info:
        if deferred:
            with guard.collective(None):
                write_results(str(path), *_results_args())
        else:
            write_results(str(path), *_results_args())
    assert info.value.signum == signal.SIGTERM and seen["temporary"].endswith(".tmp")
    if deferred:
        assert seen["deleted_while_writing"]
    assert leftovers(tmp_path) == []


def test_sigterm_during_generate_leaves_the_file_as_it_was(tmp_path):
    """Outside a run the handler raises at once: the command exits 143 and the file it was
    adding a group to is unchanged, with no temporary file beside it."""
    path = tmp_path / "a.h5"
    assert run_hisparse(["generate", "trefethen", path, "n=10"]).returncode == 0
    before = path.read_bytes()
    script = tmp_path / "term.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, sys
        import h5py
        from hisparse import cli
        create = h5py.Group.create_dataset
        def create_then_term(self, *args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)  # arrives in the middle of the write
            return create(self, *args, **kwargs)
        h5py.Group.create_dataset = create_then_term
        sys.exit(cli.main(["generate", "poisson", {str(path)!r}, "dims=[4,4]", "--group", "/b"]))
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert "interrupted by SIGTERM" in proc.stderr and "Traceback" not in proc.stderr
    assert path.read_bytes() == before and leftovers(tmp_path) == ["a.h5", "term.py"]

"""``hisparse jobs``: generated Slurm / PBS / mpirun scripts, checked by their text, by ``bash -n``
and shellcheck, and by running them against fake ``qsub`` / ``mpiexec`` commands that record what
they were given."""
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hisparse.jobs import walltime_seconds
from hisparse.parallel import StopRequest

from conftest import ROOT, run_hisparse

QUICKSTART = ROOT / "inputs" / "quickstart.yaml"


def _jobs(tmp_path, *args, config=QUICKSTART, study_id="s1"):
    """Run ``hisparse jobs`` and return (completed process, jobs directory)."""
    proc = run_hisparse(["jobs", config, "--study-id", study_id, "--study-dir",
                         tmp_path / "study", "--workdir", ROOT, *args], cwd=tmp_path)
    return proc, tmp_path / "study" / "jobs" / study_id


def _ok(proc):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _directives(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _bash_n(path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{path}: {proc.stderr}"


def _shellcheck(path):
    exe = shutil.which("shellcheck")
    if exe is None:
        return
    proc = subprocess.run([exe, "-S", "warning", "-s", "bash", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, f"shellcheck {path}:\n{proc.stdout}{proc.stderr}"


def _fake_command(bindir, name, body):
    path = bindir / name
    path.write_text("#!/bin/bash\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


# -- text of the generated scripts -----------------------------------------------------------------

def test_slurm_chain_srun_one_script_per_rank_count(tmp_path):
    proc, jobs = _jobs(tmp_path, "--ranks", "1,4,8", "--gpus-per-node", "4", "--account", "abc",
                       "--partition", "gpu", "--module", "cuda/12.4", "--time", "01:00:00")
    _ok(proc)
    names = sorted(p.name for p in jobs.iterdir())
    assert names == ["config.yaml", "r0001.sbatch", "r0004.sbatch", "r0008.sbatch", "study.yaml",
                     "submit.sh"]
    # the jobs run a copy of the config, so an edit after submission changes no queued job
    assert (jobs / "config.yaml").read_bytes() == QUICKSTART.read_bytes()
    for name in ("r0001.sbatch", "r0004.sbatch", "r0008.sbatch", "submit.sh"):
        assert f"wrote {os.path.relpath(jobs / name, tmp_path)}" in proc.stdout
        _bash_n(jobs / name)
        _shellcheck(jobs / name)
    text = (jobs / "r0008.sbatch").read_text()
    head = _directives(text, "#SBATCH")
    for expected in ("--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--gpus-per-task=1",
                     "--cpus-per-task=8", "--time=01:00:00", "--signal=B:USR1@120",
                     "--account=abc", "--partition=gpu", "--job-name=hs8-s1"):
        assert f"#SBATCH {expected}" in head, (expected, head)
    assert "module load cuda/12.4" in text
    assert "launch srun " in text and "--gpus-per-task=1" in text
    # every run is tagged with its study and writes into the study directory
    study_dir = tmp_path / "study"
    for part in ("--set run.study=strong", "--set run.study_id=s1",
                 f"--set output.dir={study_dir}", f"run {jobs / 'config.yaml'} --quiet"):
        assert part in text, part
    small = _directives((jobs / "r0001.sbatch").read_text(), "#SBATCH")
    assert "#SBATCH --nodes=1" in small and "#SBATCH --ntasks=1" in small
    spec = yaml.safe_load((jobs / "study.yaml").read_text())
    assert spec["ranks"] == [1, 4, 8] and spec["kind"] == "strong" and spec["id"] == "s1"


def test_slurm_mpiexec_sees_every_gpu_of_the_node(tmp_path):
    proc, jobs = _jobs(tmp_path, "--ranks", "8", "--gpus-per-node", "4", "--launcher", "mpiexec")
    _ok(proc)
    text = (jobs / "r0008.sbatch").read_text()
    head = _directives(text, "#SBATCH")
    assert "#SBATCH --gpus-per-node=4" in head
    assert not any("gpus-per-task" in line for line in head)
    assert 'launch mpiexec -n "$nranks"' in text and "--ppn" in text
    _shellcheck(jobs / "r0008.sbatch")


def test_slurm_array_and_single_modes(tmp_path):
    proc, jobs = _jobs(tmp_path, "--ranks", "1,2,4", "--mode", "array", study_id="arr")
    _ok(proc)
    text = (jobs / "array.sbatch").read_text()
    assert "#SBATCH --array=0-2" in text and "#SBATCH --ntasks=4" in text
    assert 'study_run "${SLURM_ARRAY_TASK_ID:-0}"' in text
    assert "%x-%A_%a.out" in text
    _bash_n(jobs / "array.sbatch")
    proc, jobs = _jobs(tmp_path, "--ranks", "1,2,4", "--mode", "single", study_id="one")
    _ok(proc)
    text = (jobs / "study.sbatch").read_text()
    assert "for index in 0 1 2; do" in text
    _shellcheck(jobs / "study.sbatch")


def test_pbs_select_lines_through_a_fake_qsub(tmp_path):
    """submit.sh hands each script to qsub with a dependency on the previous job; every script
    asks for whole nodes of 4 GPUs plus one partial node, one MPI process per GPU."""
    proc, jobs = _jobs(tmp_path, "--scheduler", "pbs", "--ranks", "4,6,8", "--gpus-per-node",
                       "4", "--cpus-per-rank", "16", "--queue", "prod", "--account", "proj",
                       "--time", "00:20:00")
    _ok(proc)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "qsub.log"
    _fake_command(bindir, "qsub", f"""\
        n=$(( $(wc -l < {log} 2>/dev/null || echo 0) + 1 ))
        script="${{@: -1}}"
        cp "$script" {tmp_path}/submitted.$n
        echo "$*" >> {log}
        echo "$n.pbsserver"
        """)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(jobs / "submit.sh")], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 3
    assert calls[0].endswith("r0004.pbs") and "depend" not in calls[0]
    assert calls[1].startswith("-W depend=afterany:1.pbsserver ") and calls[1].endswith("r0006.pbs")
    assert calls[2].startswith("-W depend=afterany:2.pbsserver ")
    selects = [_directives((tmp_path / f"submitted.{i}").read_text(), "#PBS -l select=")
               for i in (1, 2, 3)]
    assert selects == [["#PBS -l select=1:ncpus=64:ngpus=4:mpiprocs=4"],
                       ["#PBS -l select=1:ncpus=64:ngpus=4:mpiprocs=4+1:ncpus=32:ngpus=2:mpiprocs=2"],
                       ["#PBS -l select=2:ncpus=64:ngpus=4:mpiprocs=4"]]
    # 6 ranks: 4 on the first node and 2 on the second (--ppn is a per-node maximum)
    assert "nranks=6 nodes=2 ntasks_per_node=4;" in (tmp_path / "submitted.2").read_text()
    text = (tmp_path / "submitted.3").read_text()
    for expected in ("#PBS -l walltime=00:20:00", "#PBS -q prod", "#PBS -A proj", "#PBS -j oe",
                     "#PBS -N hs8-s1"):
        assert expected in text.splitlines(), expected
    assert 'launch mpiexec -n "$nranks" ${ntasks_per_node:+--ppn "$ntasks_per_node"}' in text
    for name in ("r0004.pbs", "r0006.pbs", "r0008.pbs", "submit.sh"):
        _bash_n(jobs / name)
        _shellcheck(jobs / name)


@pytest.mark.parametrize("pml_flag, preset, expected", [
    (None, None, {4: "ob1", 8: "unset"}),       # one node: ob1; two nodes: Open MPI's choice
    (None, "ucx", {4: "ucx", 8: "ucx"}),        # the job's own setting wins
    ("", None, {4: "unset", 8: "unset"}),       # '' leaves Open MPI's choice everywhere
    ("ucx", None, {4: "ucx", 8: "unset"})])
def test_one_node_runs_take_the_one_node_pml(tmp_path, pml_flag, preset, expected):
    """Runs on one node start Open MPI with ``one_node_pml`` (its ucx probe of the network
    costs every rank 0.2 s of start-up), unless the job's environment chose one; runs on
    several nodes keep Open MPI's default."""
    flags = [] if pml_flag is None else ["--one-node-pml", pml_flag]
    proc, jobs = _jobs(tmp_path, "--scheduler", "pbs", "--ranks", "4,8", "--gpus-per-node", "4",
                       *flags)
    _ok(proc)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "mpiexec.log"
    _fake_command(bindir, "mpiexec", f"""\
        echo "$2 ${{OMPI_MCA_pml-unset}}" >> {record}
        """)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PBS_JOBID="1.server")
    env.pop("OMPI_MCA_pml", None)
    if preset is not None:
        env["OMPI_MCA_pml"] = preset
    for name in ("r0004.pbs", "r0008.pbs"):
        subprocess.run(["bash", str(jobs / name)], capture_output=True, text=True, env=env,
                       timeout=60, check=True)
        _shellcheck(jobs / name)
    seen = dict(line.split() for line in record.read_text().splitlines())
    assert seen == {str(n): value for n, value in expected.items()}


def test_a_bad_pml_name_is_refused(tmp_path):
    proc, _ = _jobs(tmp_path, "--no-scheduler", "--one-node-pml", "ob1; rm -rf /")
    assert proc.returncode == 2 and "one_node_pml" in proc.stderr


def test_pbs_script_runs_and_forwards_the_walltime_signal(tmp_path):
    """Run a PBS script with a fake mpiexec: the script's timer sends USR1 one second before a
    3 s walltime; the launcher gets it, stops, and the script exits with the launcher's status."""
    proc, jobs = _jobs(tmp_path, "--scheduler", "pbs", "--ranks", "8", "--gpus-per-node", "4",
                       "--time", "00:00:03", "--signal-seconds", "2")
    _ok(proc)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "mpiexec.log"
    _fake_command(bindir, "mpiexec", f"""\
        printf '%s\n' "$*" > {record}
        trap 'echo got-USR1 >> {record}; exit 7' USR1
        for _ in $(seq 100); do sleep 0.1; done
        echo no-signal >> {record}
        """)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", PBS_JOBID="1.server")
    proc = subprocess.run(["bash", str(jobs / "r0008.pbs")], capture_output=True, text=True,
                          env=env, timeout=60)
    lines = record.read_text().splitlines()
    assert lines[0].startswith("-n 8 --ppn 4 ")
    assert "-m hisparse run" in lines[0] and "--set run.study_id=s1" in lines[0]
    assert lines[1:] == ["got-USR1"], proc.stderr
    assert "got SIGUSR1" in proc.stderr
    assert proc.returncode == 7


def test_no_scheduler_mpirun_loop_and_launcher_exit_status(tmp_path):
    proc, jobs = _jobs(tmp_path, "--no-scheduler", "--launcher", "mpirun", "--ranks", "1,2,4")
    _ok(proc)
    script = jobs / "run.sh"
    text = script.read_text()
    assert not _directives(text, "#SBATCH") and not _directives(text, "#PBS")
    assert "for index in 0 1 2; do" in text and "MPIRUN_FLAGS=(--oversubscribe --bind-to none)" in text
    assert not (jobs / "submit.sh").exists()
    _shellcheck(script)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "mpirun.log"
    _fake_command(bindir, "mpirun", f"""\
        if [ "$1" = --version ]; then echo "mpirun (Open MPI) 5.0.5"; exit 0; fi
        echo "$1 $2 $3 $4 $5" >> {record}
        [ "$2" != 2 ] || exit 3   # the 2-rank run fails; the loop goes on
        """)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=60)
    # Open MPI would bind a rank to one core at 1 or 2 ranks: the set-up's threads need more
    assert record.read_text().splitlines() == [f"-n {n} --oversubscribe --bind-to none"
                                               for n in (1, 2, 4)]
    assert proc.returncode == 3 and "run 1 failed (exit 3)" in proc.stderr


# -- weak scaling ----------------------------------------------------------------------------------

def _generated_config(tmp_path, generate):
    path = tmp_path / "weak.yaml"
    path.write_text(yaml.safe_dump({"run": {"name": "w"}, "operation": {"name": "spmv"},
                                    "input": {"generate": generate}, "backend": "cpu"}))
    return path


def _run_sets(jobs_dir):
    spec = yaml.safe_load((jobs_dir / "study.yaml").read_text())
    return {run["nranks"]: run["set"] for run in spec["runs"]}


def test_weak_scaling_grows_the_generated_problem(tmp_path):
    config = _generated_config(tmp_path, {"kind": "poisson", "dims": [32, 24]})
    proc, jobs = _jobs(tmp_path, "--kind", "weak", "--ranks", "1,2,4",
                       "--weak", "input.generate.dims[0]=multiply", config=config)
    _ok(proc)
    assert _run_sets(jobs) == {1: ["input.generate.dims=[32, 24]"],
                               2: ["input.generate.dims=[64, 24]"],
                               4: ["input.generate.dims=[128, 24]"]}
    text = (jobs / "r0004.sbatch").read_text()
    assert "--set 'input.generate.dims=[128, 24]'" in text and "run.study=weak" in text
    _bash_n(jobs / "r0004.sbatch")

    config = _generated_config(tmp_path, {"kind": "rmat", "scale": 8})
    spec = tmp_path / "study.yaml"
    spec.write_text(yaml.safe_dump({"study": {"kind": "weak", "ranks": [2, 4, 8],
                                              "weak": {"input.generate.scale": "log2"}}}))
    proc, jobs = _jobs(tmp_path, "--study", spec, config=config, study_id="rm")
    _ok(proc)
    assert _run_sets(jobs) == {2: ["input.generate.scale=8"], 4: ["input.generate.scale=9"],
                               8: ["input.generate.scale=10"]}


@pytest.mark.parametrize("args, message", [
    (["--kind", "weak", "--weak", "input.generate.nnz=multiply"], "give input.generate"),
    (["--kind", "weak"], "a weak study needs rules"),
    (["--scheduler", "pbs", "--launcher", "srun"], "srun needs scheduler: slurm"),
    (["--ranks-per-node", "8", "--gpus-per-node", "4"], "one rank per GPU"),
    (["--time", "00:01:00", "--signal-seconds", "60"], "not shorter than the walltime"),
    (["--study-id", "a b"], "use letters, digits"),
])
def test_bad_studies_fail_with_one_clear_line(tmp_path, args, message):
    proc = run_hisparse(["jobs", QUICKSTART, "--study-dir", tmp_path / "s", "--workdir", ROOT,
                         *args], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("hisparse: error:") and message in proc.stderr, proc.stderr


def test_weak_rule_that_leaves_the_integers_is_refused(tmp_path):
    config = _generated_config(tmp_path, {"kind": "random_matrix", "rows": 1001})
    proc, _ = _jobs(tmp_path, "--kind", "weak", "--ranks", "2,3",
                    "--weak", "input.generate.rows=multiply", config=config)
    assert proc.returncode == 2 and "is not an integer" in proc.stderr


# -- helpers ---------------------------------------------------------------------------------------

def test_walltime_forms():
    assert walltime_seconds("00:30:00") == 1800
    assert walltime_seconds("2-01:00:00") == 2 * 86400 + 3600
    assert walltime_seconds("90") == 5400
    assert walltime_seconds("05:30") == 330  # Slurm reads MM:SS
    with pytest.raises(ValueError):
        walltime_seconds("half an hour")


def test_stop_request_sees_usr1_and_restores_the_handler():
    before = signal.getsignal(signal.SIGUSR1)
    with StopRequest() as stop:
        assert not stop.requested()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.requested() and stop.received == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) == before


def test_device_study_script_runs_a_real_study(tmp_path):
    """jobs/device_study.sh (the no-scheduler study the lead runs on a 4-GPU machine), here on
    the CPU with 1 and 2 ranks under a study id of its own (``--id``): both results files, the
    report table and the CSV."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    out = tmp_path / "out"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MPIEXEC_TIMEOUT="120")
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "device_study.sh"), "-o", str(out),
                           "--ranks", "1,2", "--gpus", "2", "--set", "backend=cpu",
                           "--set", "run.repeats=2", "--id", "quick_cpu", str(QUICKSTART)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = sorted(p.name for p in out.glob("*.h5"))
    # the priming runs (one per rank count, outside the study) left no file in it
    assert "priming run" in proc.stdout and "priming run of" not in proc.stdout
    assert len(results) == 2 and "__r1__" in results[0] and "__r2__" in results[1]
    table = (out / "report.txt").read_text().splitlines()
    assert table[0].split()[:2] == ["study_id", "study"]
    assert [line.split()[0] for line in table[2:4]] == ["quick_cpu", "quick_cpu"]
    assert (out / "study.csv").exists() and (out / "runs.csv").exists()


def test_device_study_series_reads_the_ordering_its_priming_run_saved(tmp_path):
    """The scaling study's saved-ordering Cholesky series (jobs/scaling_study.sh): the priming
    run computes the ordering and writes ``operation.params.ordering_file``; every run of the
    series (1 and 2 ranks, CPU) reads it, and the two give the same factor."""
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not found")
    from hisparse.io import read_results
    config = tmp_path / "chol.yaml"
    config.write_text(yaml.safe_dump({
        "run": {"name": "chol", "repeats": 1, "warmup": 0},
        "operation": {"name": "cholesky", "params": {"ordering": "dissection"}},
        "input": {"generate": {"kind": "poisson", "dims": [16, 15, 14]}},
        "backend": "cpu", "precision": "fp64", "peers": [], "output": {"dir": "unused"}}))
    out, order = tmp_path / "out", tmp_path / "orderings" / "chol.h5"
    order.parent.mkdir()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               MPIEXEC_TIMEOUT="120", OMP_NUM_THREADS="1")
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "device_study.sh"), "-o", str(out),
                           "--ranks", "1,2", "--gpus", "2", "--id", "chol_saved_ordering",
                           "--set", f"operation.params.ordering_file={order}", str(config)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [read_results(str(path))["attrs"] for path in sorted(out.glob("*.h5"))]
    assert [run["nranks"] for run in runs] == [1, 2] and order.exists()
    assert [run["chol_ordering_source"] for run in runs] == ["file", "file"]
    assert runs[0]["chol_factor_flops"] == runs[1]["chol_factor_flops"]
    assert all(run["verify_passed"] for run in runs)


def test_device_study_id_names_one_series(tmp_path):
    """``--id`` with two configs is refused before anything runs (both series would share it)."""
    proc = subprocess.run(["bash", str(ROOT / "jobs" / "device_study.sh"), "-o",
                           str(tmp_path / "out"), "--id", "one", str(QUICKSTART),
                           str(QUICKSTART)], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, PATH=f"{Path(sys.executable).parent}:"
                                                    f"{os.environ['PATH']}"), timeout=60)
    assert proc.returncode == 2 and "--id names one series" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_node_counts_and_the_plain_script_timer(tmp_path):
    proc, jobs = _jobs(tmp_path, "--nodes", "1,2", "--gpus-per-node", "4")
    _ok(proc)
    assert sorted(p.name for p in jobs.glob("*.sbatch")) == ["r0004.sbatch", "r0008.sbatch"]
    proc, jobs = _jobs(tmp_path, "--no-scheduler", "--ranks", "1,2", study_id="untimed")
    _ok(proc)
    assert "start_walltime_timer" not in (jobs / "run.sh").read_text()
    proc, jobs = _jobs(tmp_path, "--no-scheduler", "--ranks", "1,2", "--time", "00:10:00",
                       study_id="timed")
    _ok(proc)
    text = (jobs / "run.sh").read_text()
    assert "start_walltime_timer 480" in text  # 10 minutes less the 120 s default
    _shellcheck(jobs / "run.sh")


@pytest.mark.parametrize("script", sorted(str(p.relative_to(ROOT)) for p in
                                          [*ROOT.glob("jobs/*.sh"), *ROOT.glob(".ci/slurm-*.sh")]))
def test_shipped_scripts_parse_and_pass_shellcheck(script):
    _bash_n(ROOT / script)
    _shellcheck(ROOT / script)


def _driver_handles_the_walltime_signal():
    import inspect
    from hisparse import driver
    return "StopRequest" in inspect.getsource(driver)


@pytest.mark.skipif(not _driver_handles_the_walltime_signal(),
                    reason="the driver does not install hisparse.jobs.StopRequest yet")
def test_walltime_signal_stops_a_run_early_with_its_results_file(tmp_path):
    """USR1 sent to mpiexec (as the job script forwards it) reaches both ranks; they stop after
    the same repeat and the results file records the repeats done."""
    from conftest import mpi_env, mpiexec_command
    launcher = mpiexec_command()
    if launcher is None:
        pytest.skip("mpiexec not found")
    command = launcher + ["-n", "2", sys.executable, "-m", "hisparse", "run", str(QUICKSTART),
                          "--quiet", "--set", "backend=cpu", "--set", "run.repeats=100000000",
                          "--set", "peers=[]", "--set", f"output.dir={tmp_path}"]
    proc = subprocess.Popen(command, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # progress lines show the timed repeats have started
            if "repeat " in line:
                proc.send_signal(signal.SIGUSR1)
                break
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    import h5py
    (path,) = tmp_path.glob("*.h5")
    with h5py.File(path, "r") as handle:
        done = int(handle.attrs["repeats"])
        assert handle.attrs["stopped_early"] and handle.attrs["verify_passed"]
        assert int(handle.attrs["repeats_requested"]) == 100000000 and 0 < done < 100000000
        assert handle["perf/wall_seconds"].shape[:2] == (done, 2)


# -- a launcher whose tasks MPI does not join ------------------------------------------------------

@pytest.mark.parametrize("env, variable", [
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_NTASKS=2"),
    ({"SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "3"},
     "SLURM_STEP_NUM_TASKS=4"),
    ({"PMI_SIZE": "2", "PMI_RANK": "1"}, "PMI_SIZE=2"),
])
def test_launcher_promising_more_tasks_than_the_mpi_world_stops_the_run(tmp_path, env, variable):
    """srun with a plugin the mpich wheel does not speak makes every task a one-rank world: the
    run stops before reading its input, naming both counts and the likely cause."""
    proc = subprocess.run([sys.executable, "-m", "hisparse", "run", str(QUICKSTART), "--set",
                           "backend=cpu", "--set", f"output.dir={tmp_path}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, **env))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("hisparse: error: the launcher started") and "\n" not in line, line
    assert variable in line and "a world of 1" in line
    assert ("srun --mpi=pmi2" if variable.startswith("SLURM") else "mpiexec") in line
    assert not list(tmp_path.iterdir())  # nothing computed, nothing written


def test_the_launchers_own_size_wins_over_the_slurm_step(monkeypatch):
    """mpiexec inside an allocation starts one proxy per node with srun; its ranks inherit the
    proxies' step (2 tasks) but PMI_SIZE names the world they join."""
    from hisparse.parallel._launcher import check_world_size, promised_world_size
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "SLURM_STEP_ID",
                 "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"):
        monkeypatch.delenv(name, raising=False)
    assert promised_world_size() == (None, None)
    monkeypatch.setenv("SLURM_NTASKS", "8")  # the batch script's allocation: no step
    assert promised_world_size() == (None, None)
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "2")
    assert promised_world_size() == (2, "SLURM_STEP_NUM_TASKS")
    monkeypatch.setenv("PMI_SIZE", "1")
    assert promised_world_size() == (1, "PMI_SIZE")
    check_world_size(1)  # one rank asked, one made
    monkeypatch.setenv("PMI_SIZE", "3")
    check_world_size(3)
    with pytest.raises(Exception, match="PMI_SIZE=3"):
        check_world_size(1)


# -- what a job will see: inputs, the config copy, the Python, stale scripts, script text ----------

def test_an_input_missing_from_the_jobs_directory_is_refused_before_the_queue(tmp_path):
    config = tmp_path / "rel.yaml"
    config.write_text(QUICKSTART.read_text())  # input.path: inputs/quickstart.h5 (relative)
    workdir = tmp_path / "elsewhere"
    workdir.mkdir()
    proc = run_hisparse(["jobs", config, "--study-id", "x", "--study-dir", tmp_path / "study",
                         "--workdir", workdir], cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("hisparse: error:") and "\n" not in line
    assert "'inputs/quickstart.h5' does not exist" in line and str(workdir) in line, line
    assert not (tmp_path / "study").exists()
    # from the checkout (where the path resolves) the same config is fine
    _ok(run_hisparse(["jobs", config, "--study-id", "x", "--study-dir", tmp_path / "study",
                      "--workdir", ROOT], cwd=tmp_path))
    # an operation's HDF5 reference (SpMV's x) is an input too
    proc = run_hisparse(["jobs", config, "--study-id", "y", "--study-dir", tmp_path / "s2",
                         "--workdir", ROOT, "--set", "operation.params.x=data/x.h5:/x"],
                        cwd=tmp_path)
    assert proc.returncode == 2 and "key 'operation.params.x': 'data/x.h5' does not exist " \
        f"from the jobs' directory {ROOT}" in proc.stderr, proc.stderr


def test_jobs_run_the_python_their_setup_line_provides(tmp_path):
    """A ``--setup`` that activates an environment chooses the Python of the runs (not the one
    that ran ``hisparse jobs``); the script stops with one line when none imports hisparse."""
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    _fake_command(venv_bin, "python3", f'exec {sys.executable} "$@"\n')
    proc, jobs = _jobs(tmp_path, "--no-scheduler", "--launcher", "mpiexec", "--ranks", "2",
                       "--setup", f'export PATH="{venv_bin}:$PATH"')
    _ok(proc)
    script = jobs / "run.sh"
    assert sys.executable not in script.read_text()
    _shellcheck(script)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "mpiexec.log"
    _fake_command(bindir, "mpiexec", f'printf "%s\\n" "$@" > {record}\n')
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = record.read_text().splitlines()
    assert words[:3] == ["-n", "2", str(venv_bin / "python3")], words
    assert f"hisparse-job: python {venv_bin / 'python3'}" in proc.stderr

    _fake_command(venv_bin, "python3", "exit 1\n")  # an environment without hisparse
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 2 and "no Python that imports hisparse" in proc.stderr, proc.stderr


def test_a_second_generation_removes_stale_scripts_and_keeps_results(tmp_path):
    proc, jobs = _jobs(tmp_path, "--ranks", "1,2,4")
    _ok(proc)
    study = tmp_path / "study"
    (study / "old__spmv__r4.h5").write_bytes(b"results")
    (jobs / "notes.txt").write_text("mine")
    proc, jobs = _jobs(tmp_path, "--ranks", "1,2")
    _ok(proc)
    assert sorted(p.name for p in jobs.iterdir()) == [
        "config.yaml", "notes.txt", "r0001.sbatch", "r0002.sbatch", "study.yaml", "submit.sh"]
    assert "removed " in proc.stdout and "r0004.sbatch" in proc.stdout
    assert "already holds 1 results file" in proc.stdout
    assert (study / "old__spmv__r4.h5").read_bytes() == b"results"
    assert "r0004" not in (jobs / "submit.sh").read_text()
    proc, jobs = _jobs(tmp_path, "--ranks", "1,2", "--mode", "array")  # another mode
    _ok(proc)
    assert sorted(p.name for p in jobs.glob("*.sbatch")) == ["array.sbatch"]


@pytest.mark.parametrize("args", [
    ["--directive", "--qos=debug\necho injected"],
    ["--setup", "module purge\rrm -rf x"],
    ["--account", "abc\nxyz"],
    ["--module", "cuda\n"],
])
def test_a_control_character_in_a_script_line_is_refused(tmp_path, args):
    proc, jobs = _jobs(tmp_path, *args)
    assert proc.returncode == 2, proc.stdout
    assert "control character" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not jobs.exists()


@pytest.mark.parametrize("scheduler", ["slurm", "pbs", "none"])
def test_paths_with_spaces_are_quoted_in_the_scripts(tmp_path, scheduler):
    where = tmp_path / "my studies"
    where.mkdir()
    proc = run_hisparse(["jobs", QUICKSTART, "--study-id", "sp", "--study-dir", where / "a b",
                         "--workdir", ROOT, "--scheduler", scheduler, "--ranks", "1,2"],
                        cwd=tmp_path)
    _ok(proc)
    jobs = where / "a b" / "jobs" / "sp"
    logs = where / "a b" / "logs"
    for script in jobs.glob("*.*"):
        if script.suffix in (".sbatch", ".pbs", ".sh"):
            _bash_n(script)
            _shellcheck(script)
    if scheduler == "slurm":
        text = (jobs / "r0002.sbatch").read_text()
        assert f'#SBATCH --output="{logs}/%x-%j.out"' in text.splitlines()
    elif scheduler == "pbs":
        text = (jobs / "r0002.pbs").read_text()
        assert f'#PBS -o "{logs}/"' in text.splitlines()
    else:  # run the plain script with a fake mpiexec: the paths arrive whole
        bindir = tmp_path / "bin"
        bindir.mkdir()
        record = tmp_path / "mpiexec.log"
        _fake_command(bindir, "mpiexec", f'printf "%s\\n" "$@" >> {record}\n')
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
        proc = subprocess.run(["bash", str(jobs / "run.sh")], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        words = record.read_text().splitlines()
        assert str(jobs / "config.yaml") in words and f"output.dir={where / 'a b'}" in words


def test_srun_gets_the_mpi_plugin_of_the_mpi_mpi4py_loads(tmp_path):
    """srun_mpi: auto (the default): the job asks mpi4py which MPI it loads and gives srun the
    matching plugin (the mpich wheel: pmi2), so the tasks form one world."""
    proc, jobs = _jobs(tmp_path, "--ranks", "2", "--gpus-per-node", "0")
    _ok(proc)
    script = jobs / "r0002.sbatch"
    _shellcheck(script)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    record = tmp_path / "srun.log"
    _fake_command(bindir, "srun", f'printf "%s\\n" "$@" > {record}\n')
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_JOB_ID="7")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = record.read_text().splitlines()
    import mpi4py
    mpi4py.rc.initialize = False
    from mpi4py import MPI
    library = MPI.Get_library_version()
    expected = ("--mpi=pmi2" if library.startswith("MPICH") else
                "--mpi=pmix" if "Open MPI" in library else None)
    if expected:
        assert expected in words, words
    else:
        assert not any(w.startswith("--mpi") for w in words) and "warning" in proc.stderr
    proc, jobs = _jobs(tmp_path, "--ranks", "2", "--srun-mpi", "default", study_id="d")
    _ok(proc)
    assert "--mpi" not in (jobs / "r0002.sbatch").read_text()

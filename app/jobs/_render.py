"""The text of a study's job scripts (Slurm and PBS directives, the launch line, the walltime
guard, the submit script) and the writing of the study's jobs directory."""
import os
import re
import shlex

import yaml


def _hms(seconds):
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


_HELPERS = r'''
# --- walltime guard -----------------------------------------------------------------------------
# The launcher runs in the background so this shell can take USR1 (sent by the scheduler, or by the
# timer below, shortly before the walltime) and forward it, and TERM, to the launcher, which hands
# it to the ranks; hisparse then stops after its current repeat and writes its results file.
LAUNCHED=""
STOP=0
SIGNALLED=0
forward_signal() {
    echo "hisparse-job: got SIG$1 at $(date -u +%H:%M:%S), forwarding to the launcher" >&2
    STOP=1
    SIGNALLED=1
    if [ -n "$LAUNCHED" ]; then kill -s "$1" "$LAUNCHED" 2>/dev/null || true; fi
}
trap 'forward_signal USR1' USR1
trap 'forward_signal TERM' TERM
launch() {  # launch COMMAND...: run it in the background, wait, return its exit status
    "$@" &
    LAUNCHED=$!
    local status
    while :; do
        SIGNALLED=0
        status=0
        wait "$LAUNCHED" || status=$?
        # A trapped signal ends `wait` early (status > 128): wait again for the launcher's status.
        if [ "$SIGNALLED" = 1 ] && [ "$status" -gt 128 ]; then continue; fi
        break
    done
    LAUNCHED=""
    return "$status"
}
'''

_TIMER = r'''
# No scheduler warning signal here: a timer sends USR1 to this script before the walltime.
TIMER=""
start_walltime_timer() {  # start_walltime_timer SECONDS
    local main=$$
    (
        sleep "$1" &
        sleeper=$!
        trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
        wait "$sleeper" && kill -s USR1 "$main" 2>/dev/null
    ) &
    TIMER=$!
}
trap 'if [ -n "$TIMER" ]; then kill "$TIMER" 2>/dev/null || true; fi' EXIT
'''


def _launch_words(study):
    """The launcher command: bash words using the run's $nranks, $nodes, $ntasks_per_node."""
    words = []
    if study.launcher == "srun":
        words = ["srun", '--ntasks="$nranks"', '--nodes="$nodes"',
                 f"--cpus-per-task={study.spec['cpus_per_rank']}", "--kill-on-bad-exit=1"]
        if study.gpus_per_node:
            words.append("--gpus-per-task=1")
        if study.spec["srun_mpi"] == "auto":
            words.append('${SRUN_MPI:+--mpi="$SRUN_MPI"}')
        elif study.spec["srun_mpi"] != "default":
            words.append(f"--mpi={shlex.quote(study.spec['srun_mpi'])}")
        words.append('${ntasks_per_node:+--ntasks-per-node="$ntasks_per_node"}')
    elif study.launcher == "mpiexec":
        words = ["mpiexec", '-n "$nranks"']
        if study.scheduler != "none":
            # Hydra (MPICH, Intel MPI) and Cray PALS place --ppn ranks per node.
            words.append('${ntasks_per_node:+--ppn "$ntasks_per_node"}')
    else:  # Open MPI's mpirun (MPICH's mpirun is Hydra and takes the same -n)
        words = ["mpirun", '-n "$nranks"', '${MPIRUN_FLAGS[@]+"${MPIRUN_FLAGS[@]}"}']
        if study.scheduler != "none":
            words.append('${ntasks_per_node:+--map-by "ppr:$ntasks_per_node:node"}')
    words += [shlex.quote(a) for a in study.spec["launcher_args"]]
    return words


def _run_cases(study):
    """A bash function ``study_run INDEX`` holding every run of the study."""
    lines = ["study_run() {  # study_run INDEX: the INDEX-th run of the study",
             "    local nranks nodes ntasks_per_node",
             '    case "$1" in']
    for run in study.runs:
        per_node = run.per_node if run.nodes > 1 else ""
        extra = "".join(f" --set {shlex.quote(o)}" for o in run.overrides)
        lines.append(f"        {run.index}) nranks={run.nranks} nodes={run.nodes} "
                     f"ntasks_per_node={per_node}; set --{extra} ;;")
    lines += ['        *) echo "hisparse-job: no run with index $1 in this study" >&2; return 2 ;;',
              "    esac",
              f'    echo "hisparse-job: study {study.id}: $nranks rank(s) on $nodes node(s)'
              '${ntasks_per_node:+ ($ntasks_per_node per node)}, '
              f'$(date -u +%Y-%m-%dT%H:%M:%SZ)"']
    pml = study.spec["one_node_pml"]
    if pml:
        # hisparse moves device data through NCCL and small host messages through MPI: on one
        # node Open MPI's ob1 over shared memory serves them and starts in 0.05 s, where UCX's
        # probe of the network took 0.25 s of every rank's start-up (2xH200, stop 59). MPICH
        # ignores the variable; a job that sets it keeps its own.
        lines.append(f'    if [ "$nodes" = 1 ] && [ -z "${{OMPI_MCA_pml+x}}" ]; then '
                     f'local -x OMPI_MCA_pml={pml}; fi')
    launch = " ".join(_launch_words(study))
    hisparse = " ".join(shlex.quote(a) for a in study.hisparse_args())
    lines += [f'    launch {launch} \\',
              f'        "$PYTHON" {hisparse} "$@"',
              "}"]
    return "\n".join(lines) + "\n"


def _preamble(study, title):
    spec = study.spec
    lines = [f"# {title}",
             f"# Study {study.id}: {study.kind} scaling of {study.config_copy}",
             f"# ranks {' '.join(str(r.nranks) for r in study.runs)}; results in {study.study_dir}",
             "# Generated by `hisparse jobs`; regenerate rather than edit.",
             "set -eo pipefail"]
    if spec["modules"]:
        lines += ["# Environment modules (a batch shell may not have defined `module` yet).",
                  "if ! command -v module >/dev/null 2>&1 && [ -f /etc/profile.d/modules.sh ]; "
                  "then . /etc/profile.d/modules.sh; fi"]
        lines += [f"module load {shlex.quote(m)}" for m in spec["modules"]]
    lines += list(spec["setup"])
    lines += ["set -u",
              f"cd {shlex.quote(study.workdir)}"]
    lines += _python_lines(study)
    if study.launcher == "srun" and spec["srun_mpi"] == "auto":
        lines += _SRUN_MPI_PROBE.strip("\n").splitlines()
    lines += [f"export OMP_NUM_THREADS={spec['cpus_per_rank']}",
              "export PYTHONUNBUFFERED=1"]
    if study.launcher == "mpirun":
        flags = ("--oversubscribe " if study.scheduler == "none" else "") + "--bind-to none"
        lines += ["# Open MPI: --oversubscribe for more ranks than cores without a scheduler;",
                  "# --bind-to none, since by default it binds each rank to one core at 1 or 2",
                  "# ranks (to a socket above), and a rank's host set-up runs on threads (R-MAT",
                  "# scale 23 generated in 30 s on one core, 7 s unbound). MPICH's mpirun (Hydra)",
                  "# neither needs nor accepts them.",
                  "MPIRUN_FLAGS=()",
                  'case "$(mpirun --version 2>&1)" in *"Open MPI"*|*OpenRTE*) '
                  f"MPIRUN_FLAGS=({flags}) ;; esac"]
    return "\n".join(lines) + "\n"


def _python_lines(study):
    """Lines that set ``$PYTHON``: the explicit one, or the first python3 (python) on PATH after
    the modules and setup lines (so ``source venv/bin/activate`` chooses it); either must
    import hisparse, or the job stops before the launch with one line."""
    if study.python:
        lines = [f"PYTHON={shlex.quote(study.python)}"]
    else:
        lines = ["# The Python the modules and setup lines above put first on PATH.",
                 "PYTHON=$(command -v python3 || command -v python || true)"]
        if study.fallback_python:
            lines += ['if [ -z "$PYTHON" ] || ! "$PYTHON" -c "import hisparse" 2>/dev/null; then',
                      "    # None there imports hisparse: the Python that wrote this script.",
                      f"    PYTHON={shlex.quote(study.fallback_python)}",
                      "fi"]
    lines += ['if [ -z "$PYTHON" ] || ! "$PYTHON" -c "import hisparse" 2>/dev/null; then',
              '    echo "hisparse-job: no Python that imports hisparse (found: ${PYTHON:-none});'
              ' check the modules and setup lines, or give --python" >&2',
              "    exit 2",
              "fi",
              'echo "hisparse-job: python $PYTHON" >&2']
    return lines


#: srun_mpi: auto -- srun's --mpi plugin chosen for the MPI that mpi4py loads in the job: the
#: mpich wheel (and MPICH builds) speak PMI-2, Open MPI PMIx; Cray MPICH and unknown MPIs keep
#: the site's default plugin. A mismatch makes every task a one-rank world, which hisparse
#: then refuses (``hisparse.parallel._launcher.check_world_size``).
_SRUN_MPI_PROBE = r'''
# srun's --mpi plugin for the MPI that mpi4py loads (srun_mpi: auto): a mismatch would make
# every task a world of one rank.
SRUN_MPI=""
MPI_LIBRARY=$("$PYTHON" -c "import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False; from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" 2>/dev/null || true)
case "$MPI_LIBRARY" in
    *CRAY*|*Cray*) ;;
    MPICH*) SRUN_MPI=pmi2 ;;
    *"Open MPI"*) SRUN_MPI=pmix ;;
    *) echo "hisparse-job: warning: cannot tell which MPI mpi4py uses (${MPI_LIBRARY:-no answer}); srun keeps the site's default --mpi plugin (set srun_mpi if each rank reports a world of 1)" >&2 ;;
esac
'''


def _directive_path(path):
    """A path in a scheduler directive: double-quoted when it holds a space or another
    character a directive line would split at (sbatch and qsub both take the quotes off)."""
    return f'"{path}"' if re.search(r"[^\w@%+=:,./-]", path) else path


def _slurm_directives(study, job_name, runs, array=None):
    spec = study.spec
    nranks = max(r.nranks for r in runs)
    biggest = next(r for r in runs if r.nranks == nranks)
    lines = [f"#SBATCH --job-name={job_name}",
             f"#SBATCH --nodes={biggest.nodes}",
             f"#SBATCH --ntasks={nranks}",
             f"#SBATCH --ntasks-per-node={biggest.per_node}",  # with --ntasks: a maximum
             f"#SBATCH --cpus-per-task={spec['cpus_per_rank']}"]
    if study.gpus_per_node:
        if study.launcher == "srun":
            lines.append("#SBATCH --gpus-per-task=1")  # one visible GPU per task: device 0
        else:  # mpiexec sees every GPU of the node; the app takes local rank modulo count
            lines.append(f"#SBATCH --gpus-per-node={biggest.per_node}")
    lines.append(f"#SBATCH --time={_hms(study.walltime)}")
    pattern = "%x-%A_%a.out" if array else "%x-%j.out"
    lines.append(f"#SBATCH --output={_directive_path(os.path.join(study.logs_dir, pattern))}")
    if study.signal_seconds:
        lines.append(f"#SBATCH --signal=B:USR1@{study.signal_seconds}")
    return lines + _optional_directives("#SBATCH", (("--account=", spec["account"]),
                                                    ("--partition=", spec["partition"]),
                                                    ("--array=", array)), spec["directives"])


def _optional_directives(prefix, options, extra):
    """``PREFIX OPTIONVALUE`` lines for the options that are set, then the user's own
    directives (``PREFIX DIRECTIVE``)."""
    lines = [f"{prefix} {option}{value}" for option, value in options if value]
    return lines + [f"{prefix} {d}" for d in extra]


def _pbs_select(study, run):
    """``select=`` chunks for one run: full nodes, plus one partial node if needed."""
    cpus = study.spec["cpus_per_rank"]

    def chunk(count, ranks):
        gpus = f":ngpus={ranks}" if study.gpus_per_node else ""
        return f"{count}:ncpus={ranks * cpus}{gpus}:mpiprocs={ranks}"

    full, rest = divmod(run.nranks, run.per_node)
    chunks = [chunk(full, run.per_node)] if full else []
    if rest:
        chunks.append(chunk(1, rest))
    return "+".join(chunks)


def _pbs_directives(study, job_name, runs, array=None):
    spec = study.spec
    biggest = max(runs, key=lambda r: r.nranks)
    lines = [f"#PBS -N {job_name[:15]}",  # PBS Pro and older servers cut names at 15 characters
             f"#PBS -l select={_pbs_select(study, biggest)}",
             "#PBS -l place=scatter",
             f"#PBS -l walltime={_hms(study.walltime)}",
             "#PBS -j oe",
             f"#PBS -o {_directive_path(study.logs_dir + '/')}"]
    return lines + _optional_directives("#PBS", (("-q ", spec["queue"]), ("-A ", spec["account"]),
                                                 ("-J ", array)), spec["directives"])


def _body(study, which):
    """Script body after the directives: preamble, helpers, the runs, and what to run."""
    text = _preamble(study, which["title"]) + _HELPERS
    timer = study.signal_seconds and (study.scheduler == "pbs" or
                                      (study.scheduler == "none" and which.get("timed")))
    if timer:
        text += _TIMER
    text += "\n" + _run_cases(study) + "\n"
    if timer:
        text += (f"start_walltime_timer {study.walltime - study.signal_seconds}"
                 f"  # walltime {_hms(study.walltime)} minus {study.signal_seconds} s\n")
    text += which["main"]
    return text


_LOOP = '''status=0
# shellcheck disable=SC2043  # a study of one rank count loops once
for index in {indices}; do
    if [ "$STOP" = 1 ]; then echo "hisparse-job: stopping before run $index (signal)" >&2; break; fi
    study_run "$index" || {{ rc=$?; echo "hisparse-job: run $index failed (exit $rc)" >&2; status=$rc; }}
done
exit "$status"
'''


_ONE = '''status=0
study_run {run} || status=$?
if [ "$STOP" = 1 ]; then
    echo "hisparse-job: the run was signalled (walltime or cancel); exit status $status" >&2
fi
exit "$status"
'''


def render_scripts(study):
    """The study's scripts as ``[(file name, text, description)]`` (nothing written)."""
    out = []
    ext = {"slurm": ".sbatch", "pbs": ".pbs", "none": ".sh"}[study.scheduler]
    directives = {"slurm": _slurm_directives, "pbs": _pbs_directives}.get(study.scheduler)
    indices = " ".join(str(r.index) for r in study.runs)
    loop = _LOOP.format(indices=indices)
    if study.mode == "single":
        name = "run.sh" if study.scheduler == "none" else f"study{ext}"
        title = (f"All runs of the study in one {study.scheduler} job, one after another"
                 if directives else "All runs of the study, one after another (no scheduler)")
        head = ["#!/bin/bash"] + (directives(study, f"hs-{study.id}", study.runs)
                                  if directives else [])
        text = "\n".join(head) + "\n" + _body(study, {"title": title, "main": loop,
                                                      "timed": study.spec["signal_seconds"]
                                                      and study.scheduler == "none"
                                                      and _explicit_time(study)})
        out.append((name, text, f"{len(study.runs)} runs in one job "
                                f"({max(r.nranks for r in study.runs)} ranks allocated)"))
    elif study.mode == "array":
        last = len(study.runs) - 1
        task_var = "SLURM_ARRAY_TASK_ID" if study.scheduler == "slurm" else "PBS_ARRAY_INDEX"
        array = f"0-{last}" if last > 0 else None
        main = _ONE.format(run=f'"${{{task_var}:-0}}"' if array else "0")
        head = ["#!/bin/bash"] + directives(study, f"hs-{study.id}", study.runs, array)
        text = "\n".join(head) + "\n" + _body(study, {"title": "Job array: task i runs the i-th "
                                                               "rank count", "main": main})
        out.append((f"array{ext}", text, f"job array of {len(study.runs)} tasks, each sized for "
                                         f"{max(r.nranks for r in study.runs)} ranks"))
    else:  # chain
        for run in study.runs:
            one = _restricted(study, run)
            head = ["#!/bin/bash"] + directives(one, f"hs{run.nranks}-{study.id}", [run])
            text = "\n".join(head) + "\n" + _body(one, {"title": f"One run: {run.nranks} "
                                                                 f"rank(s)",
                                                        "main": _ONE.format(run=run.index)})
            out.append((f"r{run.nranks:04d}{ext}", text,
                        f"{run.nranks} rank(s) on {run.nodes} node(s)"))
    if study.scheduler != "none":
        out.append(("submit.sh", _submit_script(study, [o[0] for o in out]),
                    "submits the job(s); extra arguments go to every "
                    f"{'sbatch' if study.scheduler == 'slurm' else 'qsub'} call"))
    return out


def _explicit_time(study):
    """A plain script times itself only when a walltime was asked for."""
    return "time" in study.spec.get("_given", ())


def _restricted(study, run):
    """A copy of ``study`` holding only ``run`` (a chain job holds one run)."""
    import copy
    one = copy.copy(study)
    one.runs = [run]
    return one


def _submit_script(study, names):
    quoted = " ".join(shlex.quote(n) for n in names)
    lines = ["#!/bin/bash",
             f"# Submit study {study.id} ({study.kind} scaling, ranks "
             f"{' '.join(str(r.nranks) for r in study.runs)}).",
             "# Extra arguments go to every submission, e.g. --wait (Slurm) or -W block=true (PBS).",
             "set -euo pipefail",
             'here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)',
             f"mkdir -p {shlex.quote(study.logs_dir)}",
             "status=0", "previous=\"\""]
    if study.scheduler == "slurm":
        submit = ('job=$(sbatch --parsable ${dependency:+"--dependency=afterany:$previous"} '
                  '"$@" "$here/$script") || status=$?')
    else:
        submit = ('job=$(qsub ${dependency:+-W "depend=afterany:$previous"} '
                  '"$@" "$here/$script") || status=$?')
    chain = study.mode == "chain"
    lines += [f"for script in {quoted}; do",
              f'    dependency={"$previous" if chain else ""}',
              "    job=\"\"",
              f"    {submit}",
              '    job=${job%%;*}',
              '    if [ -z "$job" ]; then echo "submit: $script was not submitted" >&2; exit 1; fi',
              '    echo "submitted $script as job $job"',
              '    previous=$job',
              "done",
              'exit "$status"']
    return "\n".join(lines) + "\n"


#: The names ``hisparse jobs`` writes into a study's jobs directory (:func:`render_scripts` and
#: :func:`write_study`); on a second generation of the same id the ones it does not write again
#: are stale and are removed. Nothing else there (and nothing outside it: results, logs) is
#: touched.
_GENERATED = re.compile(r"(r\d{4}|array|study)\.(sbatch|pbs)|run\.sh|submit\.sh|"
                        r"study\.yaml|config\.yaml")


def _remove_stale(study, keep):
    """Remove the scripts an earlier generation of this study id left that this one does not
    write (a chain of other rank counts, another mode or scheduler); return their paths."""
    removed = []
    for name in sorted(os.listdir(study.jobs_dir)):
        path = os.path.join(study.jobs_dir, name)
        if name not in keep and _GENERATED.fullmatch(name) and os.path.isfile(path):
            os.remove(path)
            removed.append(path)
    return removed


def _copy_config(study):
    """The run config, copied byte for byte into the jobs directory (the scripts run the copy)."""
    import shutil
    if os.path.abspath(study.config_path) != os.path.abspath(study.config_copy):
        shutil.copyfile(study.config_path, study.config_copy)


def write_study(study):
    """Write the scripts, the copy of the config and the resolved spec; remove the scripts an
    earlier generation of the same id left that this one does not write. Returns
    ``([(path, description)], [removed path])``."""
    os.makedirs(study.jobs_dir, exist_ok=True)
    os.makedirs(study.logs_dir, exist_ok=True)
    scripts = render_scripts(study)
    removed = _remove_stale(study, {"study.yaml", "config.yaml"} | {n for n, _, _ in scripts})
    _copy_config(study)
    written = [(study.config_copy, f"copy of {study.config_path} (the jobs run it)")]
    record = {k: v for k, v in study.spec.items() if not k.startswith("_")}
    record.update(id=study.id, dir=study.study_dir, launcher=study.launcher, mode=study.mode,
                  workdir=study.workdir, python=study.python,
                  config=study.config_copy, config_source=study.config_path,
                  ranks=[r.nranks for r in study.runs], nodes=None,
                  runs=[{"nranks": r.nranks, "nodes": r.nodes, "set": r.overrides}
                        for r in study.runs])
    path = os.path.join(study.jobs_dir, "study.yaml")
    with open(path, "w") as handle:
        handle.write("# The resolved study spec written by `hisparse jobs` (read by hisparse "
                     "report).\n")
        yaml.safe_dump(record, handle, sort_keys=False)
    written.append((path, "resolved study spec"))
    for name, text, description in scripts:
        path = os.path.join(study.jobs_dir, name)
        with open(path, "w") as handle:
            handle.write(text)
        os.chmod(path, 0o755)
        written.append((path, description))
    return written, removed

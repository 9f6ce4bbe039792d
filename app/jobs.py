"""``hisparse jobs``: job scripts for strong- and weak-scaling studies (Slurm, PBS Pro, plain MPI).

A *study* is one run configuration executed at several rank counts. Every run of a study gets
``--set run.study=KIND --set run.study_id=ID --set output.dir=STUDY_DIR``, so its results file
lands in the study directory and ``hisparse report STUDY_DIR`` can aggregate the study.

The study spec (a YAML file given with ``--study``, every key also a command-line flag) says::

    kind: strong            # strong | weak
    id: spmv-strong-a       # default: <run.name>-<kind>-<UTC stamp>
    ranks: [1, 2, 4, 8]     # or nodes: [1, 2] (ranks = nodes x ranks_per_node)
    dir: results/{id}       # the study directory ({id} is replaced)
    scheduler: slurm        # slurm | pbs | none (a plain loop, no scheduler)
    launcher: srun          # srun | mpiexec | mpirun (default: srun on Slurm, else mpiexec)
    mode: chain             # chain: one job per rank count, each after the previous one
                            # array: one job array sized for the largest rank count
                            # single: one job, sized for the largest count, loops over them
    gpus_per_node: 4        # 0 for CPU-only runs
    ranks_per_node: null    # default: gpus_per_node, or the largest rank count when 0 GPUs
    cpus_per_rank: 8
    account / partition / queue / time / modules / setup / directives / launcher_args
    signal_seconds: 120     # USR1 this long before the walltime (0 = off)
    set: [run.repeats=10]   # overrides for every run
    weak: {"input.generate.dims[0]": multiply}   # how a weak study grows the problem

GPU binding: the application binds the GPU of its node-local rank modulo the visible GPUs
(``app/gpu/_device.py``), so ``srun --gpus-per-task=1`` (one visible GPU per task: device 0) and
``mpiexec`` inside an allocation with ``--gpus-per-node`` (all GPUs visible: local rank modulo
count) both give one GPU per rank.

Walltime: Slurm scripts ask for ``--signal=B:USR1@S``; PBS and plain scripts start a timer that
sends USR1 to the script ``S`` seconds before the walltime. The script runs the launcher in the
background and forwards USR1 (and TERM) to it, which forwards it to the ranks; see
:class:`hisparse.parallel.StopRequest` for the rank side.
"""
import datetime
import json
import math
import os
import re
import shlex
import sys

import yaml

from .config import Setting, load_config, non_negative, parse_overrides, positive, validate_section
from .errors import ConfigError, HisparseError

SCHEDULERS = ("slurm", "pbs", "none")
LAUNCHERS = ("srun", "mpiexec", "mpirun")
MODES = ("chain", "array", "single")
WEAK_RULES = {
    "multiply": "value x (p / p0)",
    "sqrt": "value x sqrt(p / p0), rounded (grow one side of a square grid)",
    "cbrt": "value x cbrt(p / p0), rounded (grow one side of a cubic grid)",
    "log2": "value + log2(p / p0) (e.g. rmat scale)",
}


def _positive_int_list(value):
    if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0
                            for v in value):
        return "must be a non-empty list of positive integers"
    if len(set(value)) != len(value):
        return "must not repeat a value"
    return None


def _control_problem(text):
    """Why ``text`` cannot go into a script line (a newline would start a new shell line or
    directive), or None."""
    for char in text:
        if (ord(char) < 32 and char != "\t") or ord(char) == 127:
            return (f"contains the control character {char!r}: one value is one line of the "
                    f"script (give several lines as several values)")
    return None


def _one_line(value):
    return _control_problem(value) if isinstance(value, str) else None


def _string_list(value):
    if not all(isinstance(v, str) for v in value):
        return "must be a list of strings"
    for i, item in enumerate(value):
        problem = _control_problem(item)
        if problem:
            return f"item {i} {problem}"
    return None


def _path_text(value):
    """A path the scripts name: one line, and no double quote (directives quote it with them)."""
    return _control_problem(value) or ('contains a double quote (\'"\'), which the scheduler '
                                       'directives cannot quote' if '"' in value else None)


def _srun_mpi(value):
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", value):
        return "must be auto, default or an srun --mpi plugin name such as pmi2 or pmix"
    return None


def _pml_name(value):
    if value and not re.fullmatch(r"[A-Za-z0-9_]+", value):
        return "must be an Open MPI pml component name such as ob1 or ucx, or '' (Open MPI's choice)"
    return None


def _walltime_check(value):
    try:
        walltime_seconds(value)
    except ValueError as exc:
        return str(exc)
    return None


STUDY_SCHEMA = {
    "kind": Setting(str, "strong", "strong (fixed problem) or weak (problem grows with ranks).",
                    choices=("strong", "weak")),
    "id": Setting(str, None, "Study id; default <run.name>-<kind>-<UTC stamp>.", nullable=True),
    "ranks": Setting(list, None, "Rank counts, e.g. [1, 2, 4].", nullable=True,
                     check=_positive_int_list),
    "nodes": Setting(list, None, "Node counts instead of ranks (ranks = nodes x ranks_per_node).",
                     nullable=True, check=_positive_int_list),
    "dir": Setting(str, "results/{id}", "Study directory ({id} = the study id).",
                   check=_path_text),
    "scheduler": Setting(str, "slurm", "Batch system.", choices=SCHEDULERS),
    "launcher": Setting(str, None, "MPI launcher; default srun on Slurm, mpiexec otherwise.",
                        nullable=True, choices=LAUNCHERS),
    "mode": Setting(str, "chain", "chain (a job per rank count, one after another), array, or "
                                  "single (one job looping over the counts).", choices=MODES),
    "gpus_per_node": Setting(int, 4, "GPUs per node (0: CPU-only runs).", check=non_negative),
    "ranks_per_node": Setting(int, None, "Ranks per node; default gpus_per_node (or the largest "
                                         "rank count when 0 GPUs).", nullable=True,
                              check=positive),
    "cpus_per_rank": Setting(int, 8, "CPU cores per rank (OMP_NUM_THREADS).", check=positive),
    "account": Setting(str, None, "Account / project (-A).", nullable=True, check=_one_line),
    "partition": Setting(str, None, "Slurm partition.", nullable=True, check=_one_line),
    "queue": Setting(str, None, "PBS queue.", nullable=True, check=_one_line),
    "time": Setting(str, "00:30:00", "Walltime per job, [D-]HH:MM:SS or minutes.",
                    check=_walltime_check),
    "signal_seconds": Setting(int, 120, "Send USR1 this long before the walltime (0: off).",
                              check=non_negative),
    "modules": Setting(list, [], "Environment modules to load.", check=_string_list),
    "setup": Setting(list, [], "Shell lines run before the launch (e.g. activate a venv).",
                     check=_string_list),
    "directives": Setting(list, [], "Extra scheduler options, e.g. ['--qos=debug'] or "
                                    "['-l filesystems=home'].", check=_string_list),
    "launcher_args": Setting(list, [], "Extra launcher arguments.", check=_string_list),
    "srun_mpi": Setting(str, "auto", "srun --mpi plugin: auto (the job asks the MPI that "
                                     "mpi4py loads: MPICH -> pmi2, Open MPI -> pmix), default "
                                     "(no --mpi: the site's MpiDefault) or a plugin name.",
                        check=_srun_mpi),
    "one_node_pml": Setting(str, "ob1", "Open MPI's point-to-point layer (OMPI_MCA_pml) for runs "
                                        "on one node, unless the job's environment sets one: "
                                        "ob1 starts in 0.05 s where UCX's probe of the network "
                                        "takes 0.25 s a rank; '' leaves Open MPI's choice. "
                                        "Runs on several nodes keep it.",
                            check=_pml_name),
    "python": Setting(str, None, "Python that runs hisparse; default the first python3 on "
                                 "PATH after modules and setup that imports hisparse (with "
                                 "neither: else the one running this command).",
                      nullable=True, check=_path_text),
    "workdir": Setting(str, None, "Directory the jobs start in; default the current one.",
                       nullable=True, check=_path_text),
    "set": Setting(list, [], "KEY=VALUE overrides for every run.", check=_string_list),
    "weak": Setting(dict, {}, "Weak scaling rules {config key[index]: rule}; rules: " +
                    ", ".join(WEAK_RULES) + "."),
}


def walltime_seconds(text):
    """Seconds in a walltime ``[D-]HH:MM:SS``, ``HH:MM``... or plain minutes (Slurm's forms).

    >>> walltime_seconds("01:30:00"), walltime_seconds("1-00:00:00"), walltime_seconds("45")
    (5400, 86400, 2700)
    """
    text = str(text).strip()
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not match:
        raise ValueError(f"walltime '{text}' is not [D-]HH:MM:SS or minutes")
    days, a, b, c = match.groups()
    days = int(days or 0)
    if b is None:  # minutes only ("45"), or "D-HH"
        seconds = int(a) * (3600 if days else 60)
    elif c is None:  # HH:MM (D-HH:MM) or MM:SS (Slurm reads MM:SS without days)
        seconds = int(a) * 3600 + int(b) * 60 if days else int(a) * 60 + int(b)
    else:
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    return days * 86400 + seconds


def _hms(seconds):
    return f"{seconds // 3600:02d}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


# -- the study -----------------------------------------------------------------------------------

def load_study(path=None, overrides=None, source="study spec"):
    """Read a study spec (YAML mapping) and apply command-line values on top.

    Parameters
    ----------
    path : str, optional
        YAML file; the keys of :data:`STUDY_SCHEMA`, optionally under a top-level ``study:``.
    overrides : dict, optional
        Values from command-line flags (``None`` values are ignored).

    Returns
    -------
    dict
        Validated spec, defaults filled in; ``_given`` lists the keys that were set.
    """
    raw = {}
    if path is not None:
        source = path
        try:
            with open(path) as handle:
                raw = yaml.safe_load(handle) or {}
        except OSError as exc:
            raise ConfigError(path, None, f"cannot read study spec: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(path, None, f"malformed YAML: {exc}") from None
        if isinstance(raw, dict) and set(raw) == {"study"}:
            raw = raw["study"]
        if not isinstance(raw, dict):
            raise ConfigError(path, None, "a study spec is a YAML mapping")
    raw = dict(raw)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key in ("set", "modules", "setup", "directives", "launcher_args"):
            value = list(raw.get(key) or []) + list(value)
        elif key == "weak":
            value = dict(raw.get(key) or {}, **value)
        raw[key] = value
    spec = validate_section(STUDY_SCHEMA, raw, source)
    spec["_given"] = sorted(raw)  # keys set by the file or a flag (not defaults)
    return spec


def _weak_target(key, source):
    match = re.fullmatch(r"([A-Za-z_][\w.]*?)(?:\[(\d+)\])?", key.strip())
    if not match:
        raise ConfigError(source, f"weak.{key}", "expected a config key such as "
                                                 "input.generate.nnz or input.generate.dims[0]")
    return match.group(1), (int(match.group(2)) if match.group(2) is not None else None)


def _scaled(value, rule, factor, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HisparseError(f"{where}: weak scaling needs a number, found {value!r}")
    if rule == "log2":
        steps = math.log2(factor)
        if steps != int(steps):
            raise HisparseError(f"{where}: rule 'log2' needs rank counts that are powers of two "
                                f"times the first one (ratio {factor:g})")
        return value + int(steps)
    multiplier = {"multiply": factor, "sqrt": math.sqrt(factor), "cbrt": factor ** (1 / 3)}[rule]
    scaled = value * multiplier
    if isinstance(value, int):
        if rule == "multiply" and abs(scaled - round(scaled)) > 1e-9:
            raise HisparseError(f"{where}: {value} x {factor:g} is not an integer")
        return max(1, int(round(scaled)))
    return scaled


def weak_overrides(config, rules, nranks, base_ranks, source="study spec"):
    """``--set`` strings that grow the problem of ``config`` from ``base_ranks`` to ``nranks``.

    Parameters
    ----------
    config : Config
        The resolved run configuration (generator defaults filled in).
    rules : dict of str -> str
        ``{"input.generate.dims[0]": "multiply", ...}``; rules in :data:`WEAK_RULES`.
    nranks, base_ranks : int
        Rank count of this run and of the study's first run (p and p0).

    Returns
    -------
    list of str
        ``KEY=VALUE`` overrides (values in JSON, which YAML reads back).
    """
    updates = {}
    for key, rule in rules.items():
        if rule not in WEAK_RULES:
            raise ConfigError(source, f"weak.{key}", f"unknown rule {rule!r}; expected one of "
                                                     f"{', '.join(WEAK_RULES)}")
        name, index = _weak_target(key, source)
        if name not in updates:
            if name.startswith("input.generate") and config["input.generate"] is None:
                raise ConfigError(source, f"weak.{key}",
                                  "weak scaling grows a generated input, but the config reads "
                                  "input.path: give input.generate instead")
            value = config.get(name, KeyError)
            if value is KeyError:
                raise ConfigError(source, f"weak.{key}", f"'{name}' is not a key of the run "
                                                         f"config {config.source}")
            updates[name] = json.loads(json.dumps(value))  # a private copy
        factor = nranks / base_ranks
        if index is None:
            updates[name] = _scaled(updates[name], rule, factor, key)
        else:
            if not isinstance(updates[name], list) or index >= len(updates[name]):
                raise ConfigError(source, f"weak.{key}", f"'{name}' = {updates[name]!r} has no "
                                                         f"element {index}")
            updates[name][index] = _scaled(updates[name][index], rule, factor, key)
    return [f"{name}={json.dumps(value)}" for name, value in updates.items()]


def _default_study_id(config, kind):
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{config['run.name']}-{kind}-{stamp}"


class Run:
    """One run of a study: rank count, node layout and its own ``--set`` overrides."""

    def __init__(self, index, nranks, ranks_per_node, overrides):
        self.index = index
        self.nranks = nranks
        self.nodes = -(-nranks // ranks_per_node)
        self.per_node = min(nranks, ranks_per_node)  # ranks on a full node (the last may have
        # fewer: srun, --ppn and ppr treat a per-node count as a maximum)
        self.overrides = overrides


class Study:
    """A resolved study: the spec, the run config and the list of :class:`Run`."""

    def __init__(self, config_path, spec, run_overrides=()):
        self.spec = spec
        self.config_path = os.path.abspath(config_path)
        problem = _control_problem(self.config_path)
        if problem:
            raise ConfigError(self.config_path, None, f"the config's path {problem}")
        self.workdir = os.path.abspath(spec["workdir"] or os.getcwd())
        self.common_sets = list(run_overrides) + list(spec["set"])
        self.config = _load_from(self.workdir, self.config_path, self.common_sets)
        self.kind = spec["kind"]
        self.id = spec["id"] or _default_study_id(self.config, self.kind)
        if not re.fullmatch(r"[A-Za-z0-9][\w.+-]*", self.id):
            raise ConfigError("study spec", "id", f"{self.id!r}: use letters, digits, '.', '_', "
                                                  f"'+', '-' (it names files and jobs)")
        self.scheduler = spec["scheduler"]
        self.launcher = spec["launcher"] or ("srun" if self.scheduler == "slurm" else "mpiexec")
        if self.launcher == "srun" and self.scheduler != "slurm":
            raise ConfigError("study spec", "launcher", "srun needs scheduler: slurm")
        self.mode = "single" if self.scheduler == "none" else spec["mode"]
        self.gpus_per_node = spec["gpus_per_node"]
        ranks_per_node = spec["ranks_per_node"] or self.gpus_per_node
        if spec["ranks"] is not None and spec["nodes"] is not None:
            raise ConfigError("study spec", "ranks", "give ranks or nodes, not both")
        if spec["nodes"] is not None:
            if not ranks_per_node:
                raise ConfigError("study spec", "nodes", "needs gpus_per_node or ranks_per_node")
            ranks = [n * ranks_per_node for n in spec["nodes"]]
        else:
            ranks = spec["ranks"] or [1, 2, 4]
        ranks = sorted(ranks)
        self.ranks_per_node = ranks_per_node or max(ranks)
        if self.gpus_per_node and self.ranks_per_node > self.gpus_per_node:
            raise ConfigError("study spec", "ranks_per_node",
                              f"{self.ranks_per_node} ranks per node but {self.gpus_per_node} "
                              f"GPUs per node: one rank per GPU")
        self.study_dir = os.path.abspath(os.path.join(
            self.workdir, spec["dir"].replace("{id}", self.id)))
        for key, path in (("workdir", self.workdir), ("dir", self.study_dir)):
            problem = _path_text(path)
            if problem:
                raise ConfigError("study spec", key, f"{path!r} {problem}")
        self.jobs_dir = os.path.join(self.study_dir, "jobs", self.id)
        self.logs_dir = os.path.join(self.study_dir, "logs")
        #: the copy of the run config the scripts run (written by :func:`write_study`), so an
        #: edit of the original after submission changes no queued job
        self.config_copy = os.path.join(self.jobs_dir, "config.yaml")
        #: an explicit Python; otherwise the script finds it after its modules and setup
        self.python = spec["python"]
        #: with no modules or setup lines, the job falls back to the Python running this
        #: command when python3 on the job's PATH cannot import hisparse
        self.fallback_python = (None if spec["python"] or spec["modules"] or spec["setup"]
                                else sys.executable)
        self.runs = []
        for index, nranks in enumerate(ranks):
            extra = []
            if self.kind == "weak":
                if not spec["weak"]:
                    raise ConfigError("study spec", "weak", "a weak study needs rules, e.g. "
                                      "{'input.generate.dims[0]': multiply}")
                extra = weak_overrides(self.config, spec["weak"], nranks, ranks[0])
            self.runs.append(Run(index, nranks, self.ranks_per_node, extra))
        if self.kind == "weak":  # every grown problem must still be a valid config
            for run in self.runs[1:]:
                _load_from(self.workdir, self.config_path, self.common_sets + run.overrides)
        self.walltime = walltime_seconds(spec["time"])
        self.signal_seconds = spec["signal_seconds"]
        if self.signal_seconds and self.signal_seconds >= self.walltime:
            raise ConfigError("study spec", "signal_seconds",
                              f"{self.signal_seconds} s is not shorter than the walltime "
                              f"{spec['time']}")

    def hisparse_args(self):
        """The ``hisparse run`` arguments shared by every run (after the python command); each
        run adds its own overrides (weak scaling)."""
        sets = [f"run.study={self.kind}", f"run.study_id={self.id}",
                f"output.dir={self.study_dir}"] + self.common_sets
        args = ["-m", "hisparse", "run", self.config_copy, "--quiet"]
        for item in sets:
            args += ["--set", item]
        return args


def _load_from(workdir, config_path, sets):
    """Validate the config as the job will see it (relative paths from ``workdir``), its input
    file included: a path that does not resolve from there would fail only after the queue."""
    here = os.getcwd()
    os.chdir(workdir)
    try:
        config = load_config(config_path, parse_overrides(sets))
        _check_input_file(config, workdir)
        return config
    finally:
        os.chdir(here)


def _check_input_file(config, workdir):
    """The run's input files exist, read from ``workdir`` (the current directory when called):
    ``input.path`` (holding a matrix or tensor) and the HDF5 references of the operation's
    parameters (``FILE.h5:/path``: SpMV's x, SpGEMM's B, SpTV's vector)."""
    path = config["input.path"]
    if path is not None:
        seen = _existing(config, "input.path", path, workdir)
        from .io import input_kind
        input_kind(seen, config["input.group"])  # an InputError names the file and the group
    for name, value in config["operation.params"].items():
        if isinstance(value, str) and re.fullmatch(r".+\.(h5|hdf5)(:.*)?", value) and \
                name != "checkpoint":  # the checkpoint is written, not read
            _existing(config, f"operation.params.{name}", value.partition(":")[0], workdir)


def _existing(config, key, path, workdir):
    """``path`` as the job opens it (``~`` and variables were expanded by the config's
    ``path`` settings), which must be a file."""
    seen = path
    where = "" if os.path.isabs(seen) else f" from the jobs' directory {workdir}"
    hint = ("" if os.path.isabs(seen) else " (relative paths are read from where the job "
            "starts: give --workdir, or an absolute path)")
    if not os.path.exists(seen):
        raise ConfigError(config.source, key, f"{path!r} does not exist{where}{hint}")
    if not os.path.isfile(seen):
        raise ConfigError(config.source, key, f"{path!r} is not a file{where}")
    return seen


# -- script text ---------------------------------------------------------------------------------

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


# -- the rank side of the walltime signal --------------------------------------------------------

def _int_list(text):
    try:
        values = [int(v) for v in re.split(r"[,\s]+", text.strip()) if v]
    except ValueError:
        raise ValueError(f"'{text}' is not a list of integers such as 1,2,4") from None
    return values


def _weak_rule(text):
    if "=" not in text:
        raise ValueError(f"'{text}' is not KEY=RULE, e.g. input.generate.nnz=multiply")
    key, rule = text.split("=", 1)
    return key.strip(), rule.strip()


def _cmd_jobs(args):
    overrides = {
        "kind": args.kind, "id": args.study_id, "ranks": args.ranks, "nodes": args.nodes,
        "dir": args.study_dir, "scheduler": "none" if args.no_scheduler else args.scheduler,
        "launcher": args.launcher, "mode": args.mode, "gpus_per_node": args.gpus_per_node,
        "ranks_per_node": args.ranks_per_node, "cpus_per_rank": args.cpus_per_rank,
        "account": args.account, "partition": args.partition, "queue": args.queue,
        "time": args.time, "signal_seconds": args.signal_seconds, "modules": args.module,
        "setup": args.setup, "directives": args.directive, "launcher_args": args.launcher_arg,
        "srun_mpi": args.srun_mpi, "one_node_pml": args.one_node_pml, "python": args.python,
        "workdir": args.workdir,
        "weak": dict(args.weak) if args.weak else None,
    }
    spec = load_study(args.study, overrides)
    study = Study(args.config, spec, run_overrides=args.set or [])
    written, removed = write_study(study)
    ranks = " ".join(str(r.nranks) for r in study.runs)
    print(f"hisparse jobs: study {study.id}: {study.kind} scaling over ranks {ranks}, "
          f"{study.scheduler}/{study.launcher}, mode {study.mode}")
    width = max(len(os.path.relpath(p)) for p, _ in written)
    for path in removed:
        print(f"  removed {os.path.relpath(path)}  (stale: from an earlier generation of this "
              f"study id)")
    for path, description in written:
        print(f"  wrote {os.path.relpath(path):<{width}}  {description}")
    earlier = _results_of(study)
    if earlier:
        print(f"  note: {study.study_dir} already holds {earlier} results file(s); `hisparse "
              f"report` aggregates them with the new runs of study {study.id}")
    for run in study.runs:
        if run.overrides:
            print(f"  r{run.nranks}: " + " ".join(f"--set {o}" for o in run.overrides))
    if study.scheduler == "none":
        print(f"run with:    bash {os.path.relpath(os.path.join(study.jobs_dir, 'run.sh'))}")
    else:
        print(f"submit with: bash {os.path.relpath(os.path.join(study.jobs_dir, 'submit.sh'))}")
    print(f"report with: hisparse report {os.path.relpath(study.study_dir)} --output "
          f"{os.path.relpath(study.study_dir)}")
    return 0


def _results_of(study):
    """How many results files the study directory holds already (kept, never removed)."""
    try:
        return sum(1 for name in os.listdir(study.study_dir) if name.endswith(".h5"))
    except OSError:
        return 0


def add_subcommand(subparsers):
    """Register ``hisparse jobs`` (called by :func:`hisparse.cli.build_parser`)."""
    p = subparsers.add_parser(
        "jobs", help="write Slurm/PBS/mpirun scripts for a strong or weak scaling study",
        description="Generate the job scripts of a scaling study of one run config. Values from "
                    "--study SPEC.yaml are overridden by the flags.")
    p.add_argument("config", help="the run config (YAML) every job runs")
    p.add_argument("--study", metavar="SPEC.yaml", help="study spec (see docs/cluster.md)")
    p.add_argument("--kind", choices=("strong", "weak"))
    p.add_argument("--study-id", metavar="ID")
    p.add_argument("--study-dir", metavar="DIR", help="study directory; {id} = the study id "
                                                     "(default results/{id})")
    p.add_argument("--ranks", type=_int_list, metavar="1,2,4")
    p.add_argument("--nodes", type=_int_list, metavar="1,2", help="node counts instead of ranks")
    p.add_argument("--scheduler", choices=SCHEDULERS)
    p.add_argument("--no-scheduler", action="store_true", help="same as --scheduler none")
    p.add_argument("--launcher", choices=LAUNCHERS)
    p.add_argument("--mode", choices=MODES)
    p.add_argument("--gpus-per-node", type=int, metavar="G")
    p.add_argument("--ranks-per-node", type=int, metavar="P")
    p.add_argument("--cpus-per-rank", type=int, metavar="C")
    p.add_argument("--account", "-A")
    p.add_argument("--partition", "-p")
    p.add_argument("--queue", "-q")
    p.add_argument("--time", "-t", metavar="HH:MM:SS")
    p.add_argument("--signal-seconds", type=int, metavar="S",
                   help="USR1 this long before the walltime (0: off)")
    p.add_argument("--module", action="append", metavar="NAME", help="module to load (repeatable)")
    p.add_argument("--setup", action="append", metavar="LINE", help="shell line (repeatable)")
    p.add_argument("--directive", action="append", metavar="OPT",
                   help="extra #SBATCH/#PBS option (repeatable)")
    p.add_argument("--launcher-arg", action="append", metavar="ARG", help="(repeatable)")
    p.add_argument("--srun-mpi", metavar="PLUGIN",
                   help="srun --mpi=PLUGIN: auto (default: from the MPI mpi4py loads in the job), "
                        "default (no --mpi) or a plugin, e.g. pmi2")
    p.add_argument("--one-node-pml", metavar="PML",
                   help="OMPI_MCA_pml for runs on one node unless the job sets it (default ob1; "
                        "'' leaves Open MPI's choice)")
    p.add_argument("--python", metavar="EXE", help="python that runs hisparse in the jobs "
                                                   "(default: python3 on PATH after the setup)")
    p.add_argument("--workdir", metavar="DIR", help="directory the jobs start in")
    p.add_argument("--weak", action="append", type=_weak_rule, metavar="KEY=RULE",
                   help="weak-scaling rule, e.g. 'input.generate.dims[0]=multiply' "
                        f"(rules: {', '.join(WEAK_RULES)}; repeatable)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config override for every run (repeatable)")
    p.set_defaults(func=_cmd_jobs)
    return p

"""The study spec of ``hisparse jobs``: its schema (:data:`STUDY_SCHEMA`) and the checks of its
values, walltimes, :func:`load_study`, and the weak-scaling rules that grow a run's problem with
its rank count (:func:`weak_overrides`)."""
import json
import math
import re

import yaml

from ..config import Setting, non_negative, positive, validate_section
from ..errors import ConfigError, HisparseError

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


def script_line_problem(text):
    """Why ``text`` cannot go into a script line (a newline would start a new shell line or
    directive), or None."""
    for char in text:
        if (ord(char) < 32 and char != "\t") or ord(char) == 127:
            return (f"contains the control character {char!r}: one value is one line of the "
                    f"script (give several lines as several values)")
    return None


def _one_line(value):
    return script_line_problem(value) if isinstance(value, str) else None


def _string_list(value):
    if not all(isinstance(v, str) for v in value):
        return "must be a list of strings"
    for i, item in enumerate(value):
        problem = script_line_problem(item)
        if problem:
            return f"item {i} {problem}"
    return None


def script_path_problem(value):
    """A path the scripts name: one line, and no double quote (directives quote it with them)."""
    return script_line_problem(value) or ('contains a double quote (\'"\'), which the scheduler '
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
                   check=script_path_problem),
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
                      nullable=True, check=script_path_problem),
    "workdir": Setting(str, None, "Directory the jobs start in; default the current one.",
                       nullable=True, check=script_path_problem),
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

"""A resolved study (:class:`Study`, its :class:`Run` list) and the checks that its run config,
input files and paths hold as the jobs will see them."""
import datetime
import os
import re
import sys

from ..config import load_config, parse_overrides
from ..errors import ConfigError
from ._spec import script_line_problem, script_path_problem, walltime_seconds, weak_overrides


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
        problem = script_line_problem(self.config_path)
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
            problem = script_path_problem(path)
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
        from ..io import input_kind
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

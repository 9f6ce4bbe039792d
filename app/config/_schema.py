"""The schema of a run configuration and the YAML loader.

One YAML file describes one run. Sections (all optional except ``operation.name`` and one of
``input.path`` / ``input.generate``)::

    run:        name, repeats, warmup, study, study_id, seed, progress
    operation:  name, params (validated by the operation's own PARAMS)
    input:      path, group, generate (validated by the generator's own PARAMS), duplicates
    backend:    auto | gpu | cpu
    precision:  fp64 | fp32
    index_width: auto | int32 | int64
    partition:  strategy (validated against the operation's strategies)
    verify:     enabled, rtol
    output:     dir, filename, collect
    peers:      list of peer names (validated against the operation's peers)
    gpu:        streams, block_size, cache_dir, arch, graphs, graph_priorities
    debug:      fail_rank, fail_phase, fail_mode (fault injection for tests)

Relative paths are taken relative to the current working directory (where the job starts), as
in a job script that ``cd``\\ s to its submit directory.
"""
import copy
import os

import yaml

from ..errors import ConfigError
from ._registry import (Config, Setting, all_of, at_most, file_name_part, file_name_problem,
                        non_negative, positive, validate_section)

#: The most repeats (timed or warm-up) a run takes: each timed one is kept in memory until the
#: results are written; a run meant to go on until its walltime signal asks for this many.
MAX_REPEATS = 10 ** 9

def channel_count(value):
    """Check of ``parallel.nccl_channels``: ``auto`` or a count >= 0."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return None
    return "must be auto or a channel count >= 0"


def true_false_or_auto(value):
    """Check of a switch whose default is the operation's: true, false or ``auto``."""
    if value == "auto" or isinstance(value, bool):
        return None
    return "must be true, false or auto"


# The registries this package validates against are handed in by their owners at package init
# (``hisparse/__init__.py`` calls :func:`provide`), so ``config`` imports nothing above it.
_PROVIDED = {}


def provide(operation_names=None, operation_class=None, generator_spec=None):
    """Hand in the registries the schema validates against.

    Parameters
    ----------
    operation_names : sequence of str, or a callable returning one
        Registered operation names (for the "missing operation.name" message).
    operation_class : callable(name, source) -> Operation subclass
        Resolves ``operation.name``; raises ConfigError for an unknown name. The class gives
        ``PARAMS``, ``PARTITIONS`` and ``PEERS``.
    generator_spec : callable(spec, source, prefix) -> dict
        Validates ``input.generate``.
    """
    for key, value in (("operation_names", operation_names),
                       ("operation_class", operation_class),
                       ("generator_spec", generator_spec)):
        if value is not None:
            _PROVIDED[key] = value


def _provided(key):
    try:
        return _PROVIDED[key]
    except KeyError:
        raise RuntimeError(f"hisparse.config: no '{key}' was provided; import hisparse (whose "
                           f"__init__ hands the registries in) before validating") from None

#: The placeholders of ``output.filename``, with the kind of value each stands for (used to test a
#: template when the config is loaded; the run fills in its own).
RESULTS_NAME_FIELDS = {"name": "hisparse", "op": "spmv", "nranks": 1, "utc": "20000101T000000Z",
                       "run_id": "0123abcd", "job_id": "nojob"}


def _results_name_template(template):
    """Check for ``output.filename``: only the documented placeholders, as plain fields (no
    attribute or index access, no conversion, no nested field), and a plain file name."""
    import string
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError as exc:
        return f"is not a valid name template ({exc})"
    known = ", ".join("{" + k + "}" for k in RESULTS_NAME_FIELDS)
    for _, field, spec, conversion in fields:
        if field is None:
            continue
        if field not in RESULTS_NAME_FIELDS:
            return f"has the placeholder {{{field}}}; the known ones are {known}"
        if conversion or (spec and "{" in spec):
            return f"has a conversion or nested field in {{{field}}}; use plain {known}"
    try:
        sample = template.format(**RESULTS_NAME_FIELDS)
    except (ValueError, TypeError) as exc:
        return f"cannot be filled in ({exc})"
    problem = file_name_problem(sample)
    return f"must give a file name, but {sample!r} {problem}" if problem else None


SCHEMA = {
    "run": {
        "name": Setting(str, "hisparse", "Run name, used in the results file name (no '/', at "
                                         "most 255 bytes).", check=file_name_part),
        "repeats": Setting(int, 5, "Timed repetitions (at most 1e9; a run stopped by its "
                                   "walltime signal writes the repeats done).",
                           check=all_of(positive, at_most(MAX_REPEATS, "each repeat's times are "
                                                                       "kept in memory"))),
        "warmup": Setting(int, 1, "Untimed repetitions before the timed ones (at most 1e9).",
                          check=all_of(non_negative, at_most(MAX_REPEATS, "as run.repeats"))),
        "study": Setting(str, "single", "Kind of study this run belongs to.",
                         choices=("single", "strong", "weak")),
        "study_id": Setting(str, None, "Identifier shared by the runs of one study.", nullable=True),
        "seed": Setting(int, 0, "Seed for random vectors and factors.", check=non_negative),
        "progress": Setting(bool, True, "Rank 0 prints progress: the read, the setup (and "
                            "Cholesky's analysis) and the repeats, each taking over a second."),
    },
    "operation": {
        "name": Setting(str, None, "Operation to run: spmv, spgemm, sptv, cpals, cholesky.",
                        nullable=True),
        "params": Setting(dict, {}, "Operation-specific parameters (see docs/config.md)."),
    },
    "input": {
        "path": Setting(str, None, "HDF5 input file (~ and $VARS expand; a relative path is "
                                  "taken from the working directory).", nullable=True,
                        path=True),
        "group": Setting(str, "/", "HDF5 group holding the matrix or tensor."),
        "generate": Setting(dict, None, "Generator spec {kind: ..., ...} used instead of a file.",
                            nullable=True),
        "duplicates": Setting(str, "sum", "What to do with duplicate entries.",
                              choices=("sum", "reject")),
    },
    "backend": Setting(str, "auto", "Where kernels run; auto = gpu if PyCUDA and a GPU exist.",
                       choices=("auto", "gpu", "cpu")),
    "precision": Setting(str, "fp64", "Floating-point precision of values.",
                         choices=("fp64", "fp32")),
    "index_width": Setting(str, "auto", "Index integer width; auto = int32 unless it overflows.",
                           choices=("auto", "int32", "int64")),
    "partition": {
        "strategy": Setting(str, "auto", "Partition strategy; auto = the operation's default."),
    },
    "verify": {
        "enabled": Setting(bool, True, "Check the gathered result against the reference."),
        "rtol": Setting(float, None, "Relative tolerance; null = the operation's default for the "
                                     "precision.", nullable=True, check=positive),
    },
    "output": {
        "dir": Setting(str, "results", "Directory of the results file (~ and $VARS expand).",
                       path=True),
        "filename": Setting(str, "{name}__{op}__r{nranks}__{utc}__{run_id}.h5",
                            "Results file name template: {name} {op} {nranks} {utc} {run_id} "
                            "{job_id}. An existing file is never replaced: the run refuses to "
                            "start.", check=_results_name_template),
        "collect": Setting(str, "gather", "Where the result goes after the timed repeats: "
                                          "gather = to rank 0, into /result; parts = each rank "
                                          "writes its part to NAME.partRANK.h5 beside the "
                                          "results file, whose /result joins them as HDF5 "
                                          "virtual datasets; none = no result arrays (verified "
                                          "by the operation's checksums where it has them, "
                                          "else verify_skipped says why).",
                           choices=("gather", "parts", "none")),
        "compression": Setting(str, "none", "HDF5 filter of the /result arrays: none (the "
                                            "fastest to write and read: gzip level 4 took 1.3 "
                                            "s for a 33 MB fp64 vector and saved 6% of it), "
                                            "gzip (level 4 with byte shuffle: every HDF5 "
                                            "reader has it; index arrays shrink 5-8x) or lzf "
                                            "(h5py's faster filter; other readers need its "
                                            "plugin).",
                               choices=("none", "gzip", "lzf")),
    },
    "peers": Setting(list, [], "Peer implementations timed in the same run (e.g. scipy, "
                               "cusparse)."),
    "parallel": {
        "transport": Setting(str, "auto", "How collectives move data between ranks: nccl (GPU "
                                          "buffers, GPU to GPU), mpi (host buffers); auto = "
                                          "nccl for a multi-rank GPU run of an operation that "
                                          "moves device buffers between ranks (SpMV, CP-ALS) "
                                          "when CuPy's NCCL imports, else mpi.",
                             choices=("auto", "nccl", "mpi")),
        "timeout_s": Setting(float, 600.0, "Seconds an NCCL collective may take before the "
                                           "rank declares a peer dead, aborts NCCL and ends "
                                           "the job.", check=positive),
        "nccl_channels": Setting((str, int), "auto", "Channels an NCCL communicator may use "
                                                     "(NCCL_MAX_NCHANNELS; NCCL connects each "
                                                     "pair of ranks on every channel at first "
                                                     "use): auto = the operation's (SpMV 4, "
                                                     "else 16), 0 = NCCL's own choice. "
                                                     "NCCL_MAX_NCHANNELS set in the job's "
                                                     "environment wins.",
                                 check=channel_count),
        "connect_early": Setting((str, bool), "auto", "A device transport makes its "
                                                      "connections to every peer (an exchange "
                                                      "and an all-reduce of a few MB) on its "
                                                      "set-up thread while the input is read "
                                                      "and planned, instead of in the "
                                                      "operation's first exchange: true, "
                                                      "false, or auto = the operation's "
                                                      "choice (SpMV on one node, whose plan "
                                                      "is long enough to hide them: true; "
                                                      "across nodes, where they would join "
                                                      "every pair of ranks, and the other "
                                                      "operations: false).",
                                 check=true_false_or_auto),
    },
    "gpu": {
        "streams": Setting(int, 4, "CUDA streams per rank.", check=positive),
        "block_size": Setting(int, 256, "Threads per block for kernels that take it.",
                              check=positive),
        "cache_dir": Setting(str, None, ("Compiled-kernel cache; null = $HISPARSE_CACHE_DIR, else "
                                         "~/.cache/hisparse/kernels ($XDG_CACHE_HOME), else "
                                         "$TMPDIR/hisparse-cache-<uid> where that is not "
                                         "writable."),
                             nullable=True, path=True),
        "arch": Setting(str, None, "nvcc -arch; null = the device's own (sm_XY).", nullable=True),
        "graphs": Setting(bool, True, "Record an operation's repeated launches (SpMV's chained "
                                      "products, SpTV's product, SpGEMM's bounded-output "
                                      "product) once as CUDA graphs and replay "
                                      "them, where the whole sequence stays on the device (one "
                                      "rank, or the NCCL transport)."),
        "graph_priorities": Setting(bool, True, "In a recorded graph, run the kernels on the "
                                                "critical path (a halo exchange, the small "
                                                "kernels after it) at the highest priority and "
                                                "a long product beside them at the lowest, so "
                                                "the exchange overlaps the product instead of "
                                                "waiting for it to drain (SpMV)."),
    },
    "debug": {
        "fail_rank": Setting(int, None, "Rank that fails on purpose (tests).", nullable=True),
        "fail_phase": Setting(str, "compute", "Phase where it fails ('iteration': inside an "
                                              "iterative operation, see fail_iteration; 'ipc': "
                                              "Cholesky's mapping of the other GPUs' memory, "
                                              "which falls back to the host).",
                              choices=("read", "partition", "compute", "iteration", "gather",
                                       "verify", "peers", "write", "parts", "results", "ipc")),
        "fail_iteration": Setting(int, None, "With fail_phase: iteration, the iteration (1-based)"
                                             " after which the rank fails; null = the first.",
                                  nullable=True, check=positive),
        "fail_mode": Setting(str, "raise", "raise an exception, kill the process, send it "
                                           "SIGINT, SIGTERM or SIGUSR1, or fail as a full disk "
                                           "does (enospc: an OSError).",
                             choices=("raise", "kill", "sigint", "sigterm", "sigusr1", "enospc")),
    },
}


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that repeats a key (PyYAML keeps the last one
    silently, dropping a whole block the user wrote)."""

    def construct_mapping(self, node, deep=False):
        seen = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # '<<: *anchor' merges may be overridden on purpose
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # an unhashable key: PyYAML itself reports it below
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {first + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(exc):
    """A YAML error on one line: where, then what."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"{where}{problem}"


def yaml_load(text):
    """Parse YAML text like ``yaml.safe_load``, refusing duplicate keys."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def parse_overrides(items, source="--set", example="output.dir=results"):
    """Parse ``key.sub=value`` strings; values are YAML scalars or flow collections (a repeated
    key in a flow mapping is refused).

    Parameters
    ----------
    items : list of str
    source : str
        Where they come from, for messages.
    example : str
        A well-formed item, shown when one is not KEY=VALUE.

    Returns
    -------
    list of (str, object)
    """
    parsed = []
    for item in items or ():
        if "=" not in item:
            raise ConfigError(source, item, f"expected KEY=VALUE (e.g. {example})")
        key, text = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(source, item, "empty key")
        try:
            value = yaml_load(text) if text.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(source, key, f"value is not valid YAML: {_yaml_problem(exc)} "
                                           f"(quote it: {key}=\"...\")") from None
        parsed.append((key, value))
    return parsed


def _apply_override(raw, key, value):
    node = raw
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError("--set", ".".join(parts[:i + 1]),
                              f"is a {type(child).__name__}, cannot set '{key}' inside it")
        node = child
    node[parts[-1]] = value


def config_from_dict(raw, source="<config>", overrides=()):
    """Validate a configuration mapping (as loaded from YAML) and return a :class:`Config`.

    Parameters
    ----------
    raw : dict
        The user's configuration.
    source : str
        Name used in error messages (normally the YAML path).
    overrides : list of (str, object)
        Dotted-key overrides applied before validation (``--set``).
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(source, None, f"expected a YAML mapping at top level, got "
                                        f"{type(raw).__name__}")
    raw = copy.deepcopy(raw)
    _replace_input_source(raw, overrides)
    for key, value in overrides:
        _apply_override(raw, key, value)
    data = validate_section(SCHEMA, raw, source)
    _validate_operation(data, source)
    _validate_input(data, source)
    return Config(data=data, source=source, overrides=list(overrides))


#: the keys naming where a run's input comes from; a config gives exactly one
INPUT_SOURCES = ("path", "generate")


def _replace_input_source(raw, overrides):
    """An override that gives the input's source replaces the file's other one: ``--set
    input.path=B.h5`` on a config that generates its input reads B.h5 (and ``--set
    input.generate.kind=...`` on one that reads a file generates). Overrides that set both, or
    clear one (null), change nothing here: the usual checks then apply."""
    def given(name):
        return any(value is not None and (key == f"input.{name}" or
                                          key.startswith(f"input.{name}."))
                   for key, value in overrides)
    section = raw.get("input")
    if not isinstance(section, dict):
        return
    path, generate = (given(name) for name in INPUT_SOURCES)
    if path != generate:
        section.pop("generate" if path else "path", None)


def _validate_operation(data, source):
    name = data["operation"]["name"]
    if name is None:
        names = _provided("operation_names")
        names = names() if callable(names) else names
        raise ConfigError(source, "operation.name",
                          f"missing; expected one of {', '.join(repr(o) for o in names)}")
    op_cls = _provided("operation_class")(name, source)
    data["operation"]["params"] = validate_section(op_cls.PARAMS, data["operation"]["params"],
                                                   source, "operation.params.")
    strategies = ("auto",) + tuple(op_cls.PARTITIONS)
    Setting(str, "auto", "", choices=strategies).validate(data["partition"]["strategy"], source,
                                                         "partition.strategy")
    for i, peer in enumerate(data["peers"]):
        Setting(str, None, "", choices=tuple(op_cls.PEERS)).validate(peer, source, f"peers[{i}]")


def _validate_input(data, source):
    section = data["input"]
    if section["path"] is None and section["generate"] is None:
        raise ConfigError(source, "input", "give either input.path (an HDF5 file) or "
                                           "input.generate (a generator spec)")
    if section["path"] is not None and section["generate"] is not None:
        raise ConfigError(source, "input", "give only one of input.path and input.generate")
    if section["generate"] is not None:
        section["generate"] = _provided("generator_spec")(section["generate"], source,
                                                          "input.generate.")


def load_config(path, overrides=()):
    """Read, validate and resolve a YAML run configuration.

    Parameters
    ----------
    path : str or os.PathLike
        The YAML file.
    overrides : list of str or list of (str, object)
        ``key.sub=value`` strings (as given to ``--set``) or parsed pairs.

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        The file is missing or malformed, a key is unknown, or a value has the wrong type.
    """
    path = os.fspath(path)
    if overrides and isinstance(overrides[0], str):
        overrides = parse_overrides(overrides)
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(path, None, "config file not found") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a directory, not a config file") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read config file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError(path, None, f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on "
                                      f"line {line}); is this a YAML config?") from None
    try:
        raw = yaml_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(path, None, f"malformed YAML: {_yaml_problem(exc)}") from None
    return config_from_dict(raw, source=path, overrides=overrides)

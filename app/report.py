"""``hisparse report``: tabulate results files, and aggregate scaling studies.

Two views of the same files:

- one row per run (and peer): :func:`run_rows`, :func:`format_table`, :func:`format_csv`;
- one row per rank count of each study *series* (runs sharing study id, operation, input,
  backend and precision): :func:`study_rows` with time, speedup, parallel efficiency, load
  imbalance (max/mean over ranks), the per-phase breakdown (compute / communication / transfers /
  other) of the slowest rank, setup time and the peers' times; :func:`write_plots` draws speedup
  and efficiency against ranks and the stacked phase breakdown (matplotlib, optional).

Time to solution comes first: what a user waits for from the job's start to results on disk,
``tts = startup (the process's launch to the run's first phase: interpreter, imports, MPI, GPU
binding; slowest rank; recorded by hisparse run) + setup (read, partition, distribute, upload,
format, ..., and the driver's prepare: the rest of the set-up's wall time; the slowest rank's
sum, or in files without prepare each phase's slowest rank) + the timed repeats (sum over
repeats of the slowest rank's total) + collect (gathering or writing the distributed result
after the repeats)``, and its scaling
efficiency beside the per-repeat one. ``setup_s`` leaves ``startup`` out (that is
``startup_s``).

Definitions (T(p): median over repeats of the slowest rank's ``total`` wall time at p ranks; p0:
the series' smallest rank count)::

    strong:  speedup S = T(p0) / T(p)      efficiency E = S * p0 / p
    weak:    efficiency E = T(p0) / T(p)   speedup (scaled) S = E * p / p0
    work_efficiency = (W(p) / (p T(p))) / (W(p0) / (p0 T(p0))), W the run's work (flops per
    repeat): a weak series whose work grows faster than its input (SpGEMM on R-MAT graphs:
    products per rank 1.3x and 1.7x the one-rank run's at 2 and 4 ranks) is judged by each
    rank's rate; for a strong series (the same W) it is E
    compute_speedup, compute_efficiency: the same with T = the operation's compute time
    (its COMPUTE_PHASES, slowest rank, median over repeats), which the scaling targets use
    imbalance = median over repeats of max/mean over ranks of the compute time
"""
import csv
import glob
import io
import os
import sys

import numpy as np

from .errors import HisparseError, InputError
from .io import read_results
from .timing import event_else_wall

COLUMNS = ("operation", "input", "nranks", "backend", "precision", "tts_s", "startup_s",
           "setup_s", "compile_s", "median_s", "compute_s",
           "gflops", "gbs", "roofline", "imbalance", "verify", "verify_s", "peer", "peer_s",
           "speedup")


def expand_paths(paths, results_only=False, warnings=None):
    """Results files named directly, or found (recursively) under directories.

    With ``results_only``, HDF5 files found in directories that are not hisparse results files
    (e.g. an input matrix kept beside the results) are left out; ``.h5`` files there that do
    not open as HDF5 (truncated, corrupt) are left out too, each with a line in ``warnings``.
    """
    files, unreadable = [], []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "**", "*.h5"), recursive=True))
            if results_only:
                bad = [f for f in found if not _is_hdf5(f)]
                unreadable += bad
                if warnings is not None:
                    warnings += [f"{f}: not readable HDF5 (truncated or corrupt?); skipped"
                                 for f in bad]
            files += [f for f in found if not results_only or _is_results_file(f)]
        elif os.path.exists(path):
            files.append(path)
        else:
            raise InputError(f"{path}: no such results file or directory")
    if not files and unreadable:
        raise InputError(f"no readable results files under {', '.join(paths)}: "
                         f"{len(unreadable)} .h5 file(s) are not readable HDF5 (corrupt or "
                         f"truncated?), e.g. {unreadable[0]}")
    if not files:
        raise InputError(f"no results files (*.h5) under {', '.join(paths)}")
    return files


def _is_hdf5(path):
    """Whether ``path`` opens as HDF5 (a truncated or corrupt file does not)."""
    import h5py
    try:
        with h5py.File(path, "r"):
            return True
    except OSError:
        return False


def _short_input(text):
    """A file's base name, or a generator spec as ``kind size`` (e.g. ``poisson 160x160x160``)."""
    text = str(text)
    if not text.startswith("generate:"):
        return os.path.basename(text)
    import ast
    try:
        spec = ast.literal_eval(text[len("generate:"):])
    except (ValueError, SyntaxError):
        return text[:40]
    if not isinstance(spec, dict):
        return text[:40]
    sizes = ("n", "rows", "nnz", "stencil") + (("scale",) if spec.get("kind") == "rmat" else ())
    size = [f"{k}={_compact_count(v)}" for k, v in spec.items() if k in sizes and v is not None]
    if spec.get("dims"):
        size.insert(0, "x".join(str(d) for d in spec["dims"]))
    # No truncation: a cut number (nnz=20000 for 20000000) would mislead.
    return " ".join([str(spec.get("kind", "generate"))] + size)


def _compact_count(value):
    """20000000 -> '20M', 76879419 -> '76.9M', 4096 -> '4096'."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 100_000:
        for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
            if abs(value) >= scale:
                return f"{value / scale:.3g}{unit}"
    return str(value)


class BadResults(Exception):
    """A results file that cannot be tabulated: ``str()`` names the file and what is wrong."""


class _Attrs:
    """A results file's root attributes, read as the report needs them: a value of the wrong
    type raises :class:`BadResults` naming the file and the attribute."""

    def __init__(self, path, attrs):
        self.path, self.attrs = path, attrs

    def get(self, key, default=None):
        return self.attrs.get(key, default)

    def __contains__(self, key):
        return key in self.attrs

    def __getitem__(self, key):
        return self.attrs[key]

    def number(self, key, default=np.nan, kind=float):
        value = self.attrs.get(key, default)
        try:
            if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
                raise TypeError
            return kind(value)
        except (TypeError, ValueError, OverflowError):
            raise BadResults(f"{self.path}: attribute '{key}' = {_shown(value)} is not "
                             f"{'an integer' if kind is int else 'a number'}") from None

    def text(self, key, default=""):
        value = self.attrs.get(key, default)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if not isinstance(value, str):
            raise BadResults(f"{self.path}: attribute '{key}' = {_shown(value)} is not text")
        return value


def _shown(value):
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_for_report(path):
    """``(run, attrs)`` of a results file; :class:`BadResults` when it cannot be read."""
    try:
        run = read_results(path)
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as exc:
        raise BadResults(f"{path}: not a readable hisparse results file ({exc})") from None
    return run, _Attrs(path, run["attrs"])


def _skip_or_raise(exc, warnings):
    """A file the report cannot use: a warning line (and the file is skipped) when the caller
    collects them, else one error."""
    if warnings is None:
        raise InputError(str(exc)) from None
    warnings.append(f"{exc}; skipped")


def _memories(a):
    """How many memories (GPUs; ranks on the CPU) a run's roofline covers: recorded since issue
    35; for older files, counted from the GPU binding (whose roofline was rank 0's alone)."""
    if "roofline_memories" in a:
        return max(1, a.number("roofline_memories", kind=int))
    nranks = a.number("nranks", 1, kind=int)
    if a.text("backend") == "gpu" and a.text("gpu_binding"):
        return len(set(a.text("gpu_binding").split(",")))
    return max(1, nranks)


def run_rows(paths, warnings=None):
    """One dict per (run, peer) with the columns of :data:`COLUMNS`.

    A file that cannot be read, or whose attributes are malformed, is an
    :class:`~hisparse.errors.InputError`; with a ``warnings`` list it is skipped instead, with a
    line there naming it and the attribute."""
    rows = []
    for path in expand_paths(paths, results_only=True, warnings=warnings):
        try:
            rows += _run_rows(path)
        except BadResults as exc:
            _skip_or_raise(exc, warnings)
    return rows


def _run_rows(path):
    run, a = _read_for_report(path)
    try:
        tts = time_to_solution(run)
    except (KeyError, ValueError, IndexError) as exc:
        raise BadResults(f"{path}: /perf cannot be read ({exc})") from None
    roofline = a.number("roofline_fraction")
    if "roofline_memories" not in a:  # older files: rank 0's device alone was the roofline
        roofline /= _memories(a)
    rows = []
    base = {
        "file": path, "missing_parts": run["missing_parts"],
        "operation": a.text("operation"), "input": _short_input(a.text("input")),
        "nranks": a.number("nranks", 0, kind=int), "backend": a.text("backend"),
        "study": a.text("study") or "-",
        "precision": a.text("precision"),
        "median_s": a.number("median_total_seconds"),
        "compute_s": a.number("median_compute_seconds"),
        **tts,
        "gflops": a.number("gflops"), "gbs": a.number("gbytes_per_second"),
        "roofline": roofline,
        "imbalance": a.number("load_imbalance"),
        "verify": ("off" if not a.get("verify_enabled", True) else
                   ("ok" if a.get("verify_passed", False) else "FAIL")) +
                  (f" {a.number('verify_max_rel_error'):.1e}" if a.get("verify_enabled", True)
                   and "verify_max_rel_error" in a else ""),
        # rank 0's verification (outside tts_s; the process waits for it)
        "verify_s": a.number("verify_seconds"),
    }
    peers = run["peers"] or {"": None}
    for name, info in peers.items():
        row = dict(base, peer=name, peer_s=np.nan, speedup=np.nan)
        if info is not None:
            peer = _Attrs(f"{path}: /peers/{name}", info)
            row["peer_s"] = peer.number("median_seconds")
            row["speedup"] = peer.number("speedup")
        rows.append(row)
    return rows


def _fmt(value):
    if isinstance(value, float):
        if np.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def format_table(rows, columns=COLUMNS):
    """A fixed-width text table."""
    cells = [[_fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


#: the columns of ``hisparse report --setup`` before the runs' one-time phases
SETUP_COLUMNS = ("operation", "input", "nranks", "tts_s", "repeats_s", "compile_s")


def setup_table_columns(runs):
    """:data:`SETUP_COLUMNS`, then every one-time phase any of ``runs`` recorded (startup,
    connect, read, ..., collect), in the order the runs list them."""
    names = []
    for run in runs:
        names += [p for p in run.get("setup_phases", {}) if p not in names]
    return SETUP_COLUMNS + tuple(names)


def setup_rows(runs):
    """The runs as rows of the set-up table: each one-time phase's seconds on its slowest rank
    beside the run's time to solution."""
    return [dict(run, **run.get("setup_phases", {})) for run in runs]


def format_setup(runs, csv_out=False):
    """The set-up table of ``runs`` (``hisparse report --setup``): text, or CSV with the file
    first."""
    columns = setup_table_columns(runs)
    if csv_out:
        return format_csv(setup_rows(runs), ("file",) + columns)
    return format_table(setup_rows(runs), columns) + "\n"


def format_csv(rows, columns=("file",) + COLUMNS):
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(row)
    return out.getvalue()


# -- studies -------------------------------------------------------------------------------------

CATEGORIES = ("compute", "communication", "transfer", "other")
_TRANSFER_WORDS = ("h2d", "d2h", "upload", "download", "copy", "transfer", "memcpy")
_COMM_WORDS = ("gather", "scatter", "reduce", "bcast", "broadcast", "exchange", "comm", "halo",
               "alltoall", "sendrecv", "distribute", "redistribute", "shuffle")
#: Phases that run once per run when the operation class cannot be imported to say so.
_SETUP_GUESS = ("connect", "read", "partition", "distribute", "upload", "plan", "setup",
                "analyze", "symbolic", "compile")

STUDY_COLUMNS = ("study_id", "study", "operation", "input", "backend", "precision", "nranks",
                 "nnodes", "runs", "tts_s", "tts_efficiency", "total_s", "efficiency",
                 "work_efficiency", "speedup",
                 "compute_s", "compute_speedup", "compute_efficiency", "imbalance", "compute_pct",
                 "communication_pct", "transfer_pct", "other_pct", "exchange_bytes", "startup_s",
                 "setup_s", "compile_s", "verify", "peers")


def one_time_phases(run, wall):
    """The phases recorded once per run (setup, and collect after the repeats): from the
    scopes the file records; older files by the operation's declared phases or the NaN
    pattern (:func:`_setup_phases`)."""
    scopes = run.get("phase_scopes") or {}
    if scopes:
        return {p for p in run["phases"] if scopes.get(p) in ("setup", "after")}
    return _setup_phases(run["attrs"].get("operation", ""), run["phases"], wall)


def time_to_solution(run):
    """``tts_s``, ``startup_s``, ``setup_s`` and ``collect_s`` of one run (module docstring), and
    ``compile_s``: the slowest rank's compilation (GPU kernels and Numba's host code), inside
    ``setup_s``.

    Setup phases are those the file records with scope ``setup`` (older files: the operation's
    declared or guessed one-time phases); collect phases those of kind ``collect``.
    """
    phases = run["phases"]
    wall = np.asarray(run["wall"], dtype=float)
    kinds = run.get("phase_kinds") or {}
    once = [p for p in phases if p in one_time_phases(run, wall)]
    collect = [p for p in once if kinds.get(p) == "collect"]

    def slowest(names):
        values = [np.nanmax(wall[0, :, phases.index(p)]) for p in names
                  if np.isfinite(wall[0, :, phases.index(p)]).any()]
        return float(sum(values))

    total = wall[:, :, phases.index("total")]
    repeats_s = float(np.nansum(np.nanmax(np.where(np.isnan(total), -np.inf, total), axis=1)
                                .clip(min=0)))
    startup_s = slowest([p for p in once if kinds.get(p) == "startup"])
    setup = [p for p in once if p not in collect and kinds.get(p) != "startup"]
    if "prepare" in setup and np.isfinite(wall[0, :, phases.index("prepare")]).any():
        # Every rank's one-time phases cover its whole set-up (``prepare`` holds the rest, its
        # waits for other ranks' phases included): the set-up is the slowest rank's sum. The
        # slowest rank per phase, summed, would count a rank's wait and the phase it waited
        # for both (Cholesky: rank 1's wait in rank 0's analysis).
        setup_s = float(np.nanmax(np.nansum(wall[0][:, [phases.index(p) for p in setup]],
                                            axis=1)))
    else:  # older files: untimed waits are in no phase; each phase's slowest rank
        setup_s = slowest(setup)
    collect_s = slowest(collect)
    # Kernels and host code compiled by this run (a first run on a machine; later runs read
    # the caches): part of its set-up, shown apart so a series is not judged by a
    # once-per-machine cost. Older files record the kernels only.
    rank_vars = run.get("rank_vars", {})
    compiled = np.asarray(rank_vars.get("compile_seconds", []), dtype=float)
    host = np.asarray(rank_vars.get("host_compile_seconds", []), dtype=float)
    if host.shape == compiled.shape:
        compiled = compiled + host
    compile_s = float(np.nanmax(compiled)) if compiled.size and np.isfinite(compiled).any() \
        else 0.0
    # Each one-time phase on its slowest rank, in the run's order: where the set-up goes.
    setup_phases = {p: slowest([p]) for p in once
                    if np.isfinite(wall[0, :, phases.index(p)]).any()}
    return {"tts_s": startup_s + setup_s + repeats_s + collect_s, "startup_s": startup_s,
            "setup_s": setup_s, "collect_s": collect_s, "repeats_s": repeats_s,
            "compile_s": compile_s, "setup_phases": setup_phases}


def phase_category(name, compute_phases=()):
    """``"compute"``, ``"communication"``, ``"transfer"`` or ``"other"`` for a phase name.

    The operation's COMPUTE_PHASES are compute; names with h2d/d2h/upload/copy... are transfers;
    names with gather/scatter/reduce/bcast/exchange/distribute... are communication.
    """
    if name in compute_phases:
        return "compute"
    lowered = name.lower()
    if any(word in lowered for word in _TRANSFER_WORDS):
        return "transfer"
    if any(word in lowered for word in _COMM_WORDS):
        return "communication"
    return "other"


def _is_results_file(path):
    import h5py
    try:
        with h5py.File(path, "r") as handle:
            schema = handle.attrs.get("schema", b"")
    except OSError:
        return False
    schema = schema.decode() if isinstance(schema, bytes) else str(schema)
    return schema == "hisparse.results"


def _setup_phases(operation, phases, wall):
    """Phases recorded once per run: from the operation class, else guessed from the data."""
    try:
        from .ops import get_operation_class
        op_cls = get_operation_class(operation)
        # An older results file may lack phases the operation declares today.
        return {name for name, scope in op_cls.phase_scopes().items()
                if scope == "setup"} & set(phases)
    except (HisparseError, ImportError):  # not in this build: read it off the NaN pattern
        pass
    if wall.shape[0] > 1:
        later = np.isnan(wall[1:]).all(axis=(0, 1))
        return {p for p, once in zip(phases, later) if once and p != "total"}
    return {p for p in phases if p in _SETUP_GUESS}


def run_summary(path):
    """Per-run figures for a study: times of the slowest rank, imbalance, per-phase seconds.

    Returns
    -------
    dict
        Identity (study_id, study, operation, input, backend, precision, nranks, nnodes),
        ``total_s`` (median over repeats of the max over ranks of ``total``), ``compute_s``,
        ``imbalance``, ``phases`` ({phase: seconds of the slowest rank, median over repeats} for
        the per-repeat phases; CUDA-event time where recorded, else wall), ``categories``
        ({category: seconds}: :func:`repeat_categories`, median over repeats),
        ``tts_s``/``startup_s``/``setup_s``/``collect_s``/``repeats_s`` (time to solution and its
        parts: one-time phases and collect, max over ranks, summed), ``peers``
        ({name: median seconds}), ``verify``, ``exchange_bytes`` (bytes the ranks exchange per
        product, summed over ranks, where ``/perf`` records them; else NaN).

    Raises
    ------
    BadResults
        The file cannot be read, or an attribute the study needs is malformed.
    """
    run, a = _read_for_report(path)
    phases = run["phases"]
    wall = np.asarray(run["wall"], dtype=float)  # (repeats, ranks, phases)
    gpu = np.asarray(run["gpu"], dtype=float)
    if "total" not in phases or wall.ndim != 3 or gpu.shape != wall.shape:
        raise BadResults(f"{path}: /perf has no 'total' phase or mismatched timing arrays")
    compute_phases = tuple(p for p in a.text("compute_phases").split(",") if p)
    total = wall[:, :, phases.index("total")]
    critical = np.argmax(np.where(np.isnan(total), -np.inf, total), axis=1)  # slowest rank
    repeats = np.arange(wall.shape[0])
    setup = one_time_phases(run, wall)
    per_repeat = [p for p in phases if p not in setup and p != "total"]
    phase_seconds = {}
    # GPU phases are launched asynchronously: their wall time is the launch, and the wait shows
    # up in whichever later phase synchronises. Their CUDA-event time is what they cost.
    timed = event_else_wall(wall, gpu)
    for p in per_repeat:
        values = timed[repeats, critical, phases.index(p)]
        if np.isfinite(values).any():
            phase_seconds[p] = float(np.median(np.nan_to_num(values)))
    total_s = float(np.median(total[repeats, critical]))
    categories = repeat_categories(run, compute_phases, per_repeat, critical)
    # Compute time per (repeat, rank) as the driver defines it: GPU-event time where recorded.
    imbalance = float("nan")
    if compute_phases and all(p in phases for p in compute_phases):
        cols = [phases.index(p) for p in compute_phases]
        compute = np.nansum(event_else_wall(wall[:, :, cols], gpu[:, :, cols]), axis=2)
        mean = compute.mean(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(mean > 0, compute.max(axis=1) / mean, np.nan)
        if np.isfinite(ratio).any():
            imbalance = float(np.nanmedian(ratio))
    peers = {name: _Attrs(f"{path}: /peers/{name}", info).number("median_seconds")
             for name, info in run["peers"].items()}
    verify = ("off" if not a.get("verify_enabled", True) else
              "ok" if a.get("verify_passed", False) else "FAIL")
    exchanged = [np.nansum(np.asarray(values, dtype=float))
                 for name, values in run["rank_vars"].items()
                 if name.endswith("_bytes_per_product")
                 and np.asarray(values).dtype.kind in "iuf"]
    return {
        "file": path, "study_id": a.text("study_id"), "study": a.text("study"),
        "name": a.text("name"), "operation": a.text("operation"),
        "input": _short_input(a.text("input")), "backend": a.text("backend"),
        "precision": a.text("precision"),
        "nranks": a.number("nranks", wall.shape[1], kind=int),
        "nnodes": a.number("nnodes", 1, kind=int), "total_s": total_s,
        "compute_s": a.number("median_compute_seconds"), "imbalance": imbalance,
        "phases": phase_seconds, "categories": categories, "peers": peers,
        "verify": verify, "created_utc": a.text("created_utc"),
        "exchange_bytes": float(sum(exchanged)) if exchanged else float("nan"),
        "work": a.number("flops"),
        "repeats": int(wall.shape[0]), **time_to_solution(run),
    }


def repeat_categories(run, compute_phases, per_repeat, critical):
    """Seconds per category (:data:`CATEGORIES`) of a repeat, on its slowest rank, median over
    the repeats; in every repeat the categories add up to its ``total``.

    A phase costs its CUDA-event time where recorded, else its wall time. The work of a GPU
    phase launched asynchronously is then counted twice: by its events, and again inside the
    wall time of the later phase that waited for it (the issue's 108% compute share beside 0%
    other); streams that overlap count their common time once per phase. So when a repeat's
    phases add up to more than its total, the excess is taken from its wall-timed phases (in
    proportion: the waits), then, if any is left, from all its phases in proportion; ``other``
    is what no phase covers. ``detail`` phases, inside another phase, are not counted.
    """
    phases = run["phases"]
    wall = np.asarray(run["wall"], dtype=float)
    gpu = np.asarray(run["gpu"], dtype=float)
    kinds = run.get("phase_kinds") or {}
    counted = [p for p in per_repeat if kinds.get(p) != "detail"]
    columns = [phases.index(p) for p in counted]
    labels = [(kinds[p] if kinds.get(p) in CATEGORIES else "other") if kinds.get(p) else
              phase_category(p, compute_phases) for p in counted]
    per_repeat_categories = []
    for repeat, rank in enumerate(critical):
        total = wall[repeat, rank, phases.index("total")]
        if not np.isfinite(total):
            continue
        on_gpu = np.isfinite(gpu[repeat, rank, columns])
        seconds = np.nan_to_num(event_else_wall(wall[repeat, rank, columns],
                                                gpu[repeat, rank, columns])).clip(min=0)
        excess = seconds.sum() - total
        if excess > 0:
            waits = np.where(on_gpu, 0.0, seconds)
            if waits.sum() > 0:
                seconds = seconds - waits * min(1.0, excess / waits.sum())
                excess = seconds.sum() - total
            if excess > 0:
                seconds = seconds * (total / seconds.sum())
        out = dict.fromkeys(CATEGORIES, 0.0)
        for label, value in zip(labels, seconds):
            out[label] += float(value)
        out["other"] += max(0.0, float(total - seconds.sum()))
        per_repeat_categories.append(out)
    if not per_repeat_categories:
        return dict.fromkeys(CATEGORIES, float("nan"))
    return {cat: float(np.median([r[cat] for r in per_repeat_categories]))
            for cat in CATEGORIES}


def _series_key(summary):
    # A weak study's input grows with the rank count: its runs form one series regardless.
    grown = summary["study"] == "weak" and summary["study_id"]
    return (summary["study_id"], summary["operation"], "" if grown else summary["input"],
            summary["backend"], summary["precision"], summary["name"])


def study_rows(paths, kind=None, warnings=None):
    """One row per (series, rank count), ordered by series then ranks.

    Parameters
    ----------
    paths : list of str
        Results files or directories.
    kind : {"strong", "weak"}, optional
        Formula for runs marked ``single`` (default strong); runs marked strong/weak use their own.
        The ``study`` column says what the runs were: ``single`` runs are not labelled strong.
    warnings : list, optional
        Files that cannot be read are skipped with a line here (else an InputError).

    Returns
    -------
    list of dict
        The :data:`STUDY_COLUMNS` plus ``phases``, ``categories``, ``peer_<name>_s`` and
        ``series`` (a label).
    """
    series = {}
    for path in expand_paths(paths, results_only=True, warnings=warnings):
        try:
            summary = run_summary(path)
        except BadResults as exc:
            _skip_or_raise(exc, warnings)
            continue
        series.setdefault(_series_key(summary), []).append(summary)
    rows = []
    for key in sorted(series):
        runs = series[key]
        by_ranks = {}
        for run in runs:
            by_ranks.setdefault(run["nranks"], []).append(run)
        chosen = {}
        for nranks, group in by_ranks.items():  # repeated runs: keep the median one
            group = sorted(group, key=lambda r: r["total_s"])
            chosen[nranks] = dict(group[(len(group) - 1) // 2], runs=len(group))
        p0 = min(chosen)
        base = chosen[p0]["total_s"]
        marked = runs[0]["study"] in ("strong", "weak")
        study = runs[0]["study"] if marked else (kind or "strong")  # the formula
        label_study = study if marked else (runs[0]["study"] or "-")
        label = " ".join(x for x in (key[1], key[2] or runs[0]["input"] + " (grown)", key[3],
                                     key[4]) if x)
        if key[0]:
            label = f"{key[0]}: {label}"
        compute_base = chosen[p0]["compute_s"]
        tts_base = chosen[p0]["tts_s"]

        def scaled(reference, value, nranks):
            """(speedup, efficiency) of ``value`` against ``reference`` at ``nranks``."""
            ratio = reference / value if value > 0 else float("nan")
            if study == "weak":
                return ratio * nranks / p0, ratio
            return ratio, ratio * p0 / nranks

        for nranks in sorted(chosen):
            run = chosen[nranks]
            speedup, efficiency = scaled(base, run["total_s"], nranks)
            compute_speedup, compute_efficiency = scaled(compute_base, run["compute_s"], nranks)
            tts_speedup, tts_efficiency = scaled(tts_base, run["tts_s"], nranks)
            row = dict(run, study=label_study, series=label, speedup=speedup,
                       efficiency=efficiency,
                       work_efficiency=_work_efficiency(chosen[p0], p0, run, nranks),
                       compute_speedup=compute_speedup, compute_efficiency=compute_efficiency,
                       tts_speedup=tts_speedup, tts_efficiency=tts_efficiency)
            # Shares of the repeat (repeat_categories): they add up to 100%.
            accounted = sum(run["categories"].values())
            for cat in CATEGORIES:
                row[f"{cat}_part_s"] = run["categories"][cat]
                row[f"{cat}_pct"] = 100.0 * run["categories"][cat] / accounted \
                    if accounted > 0 else np.nan
            for name, seconds in run["peers"].items():
                row[f"peer_{name}_s"] = seconds
            row["peers"] = ", ".join(f"{name} {_fmt(seconds)}s" for name, seconds in
                                     sorted(run["peers"].items())) or "-"
            rows.append(row)
    return rows


def _work_efficiency(base, base_ranks, run, nranks):
    """Each rank's rate of work in ``run`` (``nranks`` ranks) over the base run's (the module
    docstring's ``work_efficiency``); NaN where a run records no work."""
    def rate(one, ranks):
        return one["work"] / (ranks * one["total_s"]) if one["total_s"] > 0 else float("nan")
    base_rate = rate(base, base_ranks)
    return rate(run, nranks) / base_rate if base_rate > 0 else float("nan")


def missing_runs(paths, rows):
    """Lines naming the rank counts a study spec (``jobs/*/study.yaml`` written by ``hisparse
    jobs``) expected but no results file has."""
    import yaml
    found = {}
    for row in rows:
        found.setdefault(row["study_id"], set()).add(row["nranks"])
    lines = []
    for path in paths:
        if not os.path.isdir(path):
            continue
        for spec_path in sorted(glob.glob(os.path.join(path, "jobs", "*", "study.yaml"))):
            try:
                with open(spec_path) as handle:
                    spec = yaml.safe_load(handle) or {}
                expected = [int(r) for r in spec.get("ranks") or []]
                study_id = str(spec.get("id", ""))
            except (OSError, yaml.YAMLError, TypeError, ValueError):
                continue
            missing = [r for r in expected if r not in found.get(study_id, set())]
            if missing:
                lines.append(f"study {study_id}: no results for {', '.join(map(str, missing))} "
                             f"rank(s) (expected {' '.join(map(str, expected))})")
    return lines


def format_study_table(rows, columns=STUDY_COLUMNS):
    """The study table; percentages are of T(p), the slowest rank's repeat time."""
    return format_table(rows, columns)


def format_study_csv(rows):
    """Every study column, the category seconds, each phase's seconds and each peer's seconds."""
    phases = sorted({p for r in rows for p in r["phases"]})
    peers = sorted({k for r in rows for k in r if k.startswith("peer_")})
    columns = [c for c in STUDY_COLUMNS if c != "peers"] + ["name"] + \
        [f"{c}_part_s" for c in CATEGORIES] + peers + [f"phase_{p}_s" for p in phases] + ["file"]
    flat = [dict(r, **{f"phase_{p}_s": r["phases"].get(p, np.nan) for p in phases})
            for r in rows]
    return format_csv(flat, columns)


def write_plots(rows, directory):
    """``scaling.png`` (speedup and efficiency against ranks, one line per series) and
    ``phases.png`` (stacked per-category seconds of the slowest rank, one panel per series).

    Returns
    -------
    list of str
        Files written.

    Raises
    ------
    ImportError
        matplotlib is not installed (``pip install 'hisparse[plots]'``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(directory, exist_ok=True)
    groups = {}
    for row in rows:
        groups.setdefault(row["series"], []).append(row)
    written = []

    fig, (ax_s, ax_c, ax_e) = plt.subplots(1, 3, figsize=(13, 4.2), dpi=100)
    ranks_all = sorted({r["nranks"] for r in rows})
    for label, group in groups.items():
        ranks = [r["nranks"] for r in group]
        ax_s.plot(ranks, [r["speedup"] for r in group], "o-", label=label)
        ax_c.plot(ranks, [r["compute_speedup"] for r in group], "o-", label=label)
        ax_e.plot(ranks, [r["compute_efficiency"] for r in group], "o-", label=label)
    p0 = min(ranks_all)
    for ax in (ax_s, ax_c):
        ax.plot(ranks_all, [p / p0 for p in ranks_all], "k--", lw=0.8, label="ideal")
    ax_e.axhline(1.0, color="k", ls="--", lw=0.8)
    for ax, title in ((ax_s, "speedup, total time per repeat"),
                      (ax_c, "speedup, compute phase"),
                      (ax_e, "parallel efficiency, compute phase")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks_all)
        ax.set_xticklabels([str(r) for r in ranks_all])
        ax.set_xlabel("ranks")
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
    ax_e.set_ylim(bottom=0)
    fig.tight_layout(rect=(0, 0.22, 1, 1))
    handles, labels = ax_s.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=2, frameon=False)
    path = os.path.join(directory, "scaling.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)

    n = len(groups)
    cols = min(n, 3)
    nrows = -(-n // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.4 * cols, 3.0 * nrows), dpi=100,
                             squeeze=False)
    colours = {"compute": "#4c72b0", "communication": "#dd8452", "transfer": "#55a868",
               "other": "#b0b0b0"}
    for ax, (label, group) in zip(axes.flat, groups.items()):
        x = np.arange(len(group))
        bottom = np.zeros(len(group))
        for cat in CATEGORIES:
            values = np.array([r["categories"][cat] * 1e3 for r in group])
            ax.bar(x, values, bottom=bottom, color=colours[cat], label=cat, width=0.6)
            bottom += values
        ax.set_xticks(x)
        ax.set_xticklabels([str(r["nranks"]) for r in group])
        ax.set_xlabel("ranks")
        ax.set_ylabel("ms per repeat (slowest rank)")
        ax.set_title(label if len(label) < 40 else label[:37] + "...", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(directory, "phases.png")
    fig.savefig(path)
    plt.close(fig)
    written.append(path)
    return written


def missing_part_notes(runs):
    """A warning per results file whose ``/result`` joins part files that are not there: HDF5
    reads their rows as the fill value without an error."""
    missing = {}
    for run in runs:  # rows are per (run, peer): one note per file
        if run.get("missing_parts"):
            missing[run["file"]] = run["missing_parts"]
    return [f"{path}: /result joins part files that are missing ({', '.join(parts)}); their "
            f"rows read as NaN (0 for integers): keep the part files beside the results file"
            for path, parts in missing.items()]


def report(paths, csv_out=False, per_run=False, study=False, output=None, plots=None,
           no_plots=False, stdout=None, stderr=None, setup=False):
    """What ``hisparse report`` does; returns the exit status.

    Prints the study table when the runs belong to a strong or weak study (or with ``study``),
    else one row per run; with ``setup`` one row per run of its one-time phases (where its time
    to solution goes). ``output`` writes ``report.txt``, ``study.csv``, ``runs.csv``,
    ``setup.csv`` and the plots into a directory; ``plots`` writes only the plots.
    """
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    skipped = []
    runs = run_rows(paths, warnings=skipped)
    if not runs and skipped:
        raise InputError(f"no results file could be read ({len(skipped)} skipped): "
                         f"{skipped[0]}")
    if setup:
        stdout.write(format_setup(runs, csv_out))
        return 0
    aggregate = study or (not per_run and any(r["study"] in ("strong", "weak") for r in runs))
    rows = study_rows(paths, warnings=[]) if aggregate else []
    if csv_out:
        text = format_study_csv(rows) if aggregate else format_csv(runs)
        stdout.write(text)
    else:
        text = format_study_table(rows) if aggregate else format_table(runs)
        stdout.write(text + "\n")
    notes = list(skipped)
    notes += missing_runs(paths, rows) if aggregate else []
    notes += missing_part_notes(runs)
    for line in notes:
        stderr.write(f"hisparse report: warning: {line}\n")
    if output:
        os.makedirs(output, exist_ok=True)
        files = {"runs.csv": format_csv(runs), "setup.csv": format_setup(runs, csv_out=True)}
        if aggregate:
            files["study.csv"] = format_study_csv(rows)
        files["report.txt"] = (format_study_table(rows) if aggregate else format_table(runs)) + \
            "\n" + "".join(f"warning: {line}\n" for line in notes)
        for name, content in files.items():
            with open(os.path.join(output, name), "w") as handle:
                handle.write(content)
            stderr.write(f"hisparse report: wrote {os.path.join(output, name)}\n")
    plot_dir = plots or (output if output and not no_plots else None)
    if plot_dir and not no_plots:
        if not aggregate:
            rows = study_rows(paths, warnings=[])
        try:
            for path in write_plots(rows, plot_dir):
                stderr.write(f"hisparse report: wrote {path}\n")
        except ImportError:
            stderr.write("hisparse report: plots skipped: matplotlib is not installed "
                         "(pip install 'hisparse[plots]')\n")
    return 0

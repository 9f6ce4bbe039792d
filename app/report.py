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
format, ...; slowest rank) + the timed repeats (sum over repeats of the slowest rank's total) +
collect (gathering or writing the distributed result after the repeats)``, and its scaling
efficiency beside the per-repeat one. ``setup_s`` leaves ``startup`` out (that is
``startup_s``).

Definitions (T(p): median over repeats of the slowest rank's ``total`` wall time at p ranks; p0:
the series' smallest rank count)::

    strong:  speedup S = T(p0) / T(p)      efficiency E = S * p0 / p
    weak:    efficiency E = T(p0) / T(p)   speedup (scaled) S = E * p / p0
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

COLUMNS = ("operation", "input", "nranks", "backend", "precision", "tts_s", "startup_s",
           "setup_s", "median_s", "compute_s",
           "gflops", "gbs", "roofline", "imbalance", "verify", "verify_s", "peer", "peer_s",
           "speedup")


def expand_paths(paths, results_only=False):
    """Results files named directly, or found (recursively) under directories.

    With ``results_only``, HDF5 files found in directories that are not hisparse results files
    (e.g. an input matrix kept beside the results) are left out.
    """
    files, unreadable = [], []
    for path in paths:
        if os.path.isdir(path):
            found = sorted(glob.glob(os.path.join(path, "**", "*.h5"), recursive=True))
            if results_only:
                unreadable += [f for f in found if not _is_hdf5(f)]
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


def run_rows(paths):
    """One dict per (run, peer) with the columns of :data:`COLUMNS`."""
    rows = []
    for path in expand_paths(paths, results_only=True):
        try:
            run = read_results(path)
        except (OSError, KeyError) as exc:
            raise InputError(f"{path}: not a hisparse results file ({exc})") from None
        a = run["attrs"]
        base = {
            "file": path, "missing_parts": run["missing_parts"],
            "operation": a.get("operation", ""), "input": _short_input(a.get("input", "")),
            "nranks": int(a.get("nranks", 0)), "backend": a.get("backend", ""),
            "precision": a.get("precision", ""),
            "median_s": float(a.get("median_total_seconds", np.nan)),
            "compute_s": float(a.get("median_compute_seconds", np.nan)),
            **time_to_solution(run),
            "gflops": float(a.get("gflops", np.nan)), "gbs": float(a.get("gbytes_per_second", np.nan)),
            "roofline": float(a.get("roofline_fraction", np.nan)),
            "imbalance": float(a.get("load_imbalance", np.nan)),
            "verify": ("off" if not a.get("verify_enabled", True) else
                       ("ok" if a.get("verify_passed", False) else "FAIL")) +
                      (f" {float(a['verify_max_rel_error']):.1e}" if a.get("verify_enabled", True)
                       and "verify_max_rel_error" in a else ""),
            # rank 0's verification (outside tts_s; the process waits for it)
            "verify_s": float(a.get("verify_seconds", np.nan)),
        }
        peers = run["peers"] or {"": None}
        for name, info in peers.items():
            row = dict(base, peer=name, peer_s=np.nan, speedup=np.nan)
            if info is not None:
                row["peer_s"] = float(info.get("median_seconds", np.nan))
                row["speedup"] = float(info.get("speedup", np.nan))
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

STUDY_COLUMNS = ("study_id", "study", "operation", "input", "backend", "nranks", "nnodes", "runs",
                 "tts_s", "tts_efficiency", "total_s", "efficiency", "speedup", "compute_s",
                 "compute_speedup",
                 "compute_efficiency", "imbalance", "compute_pct",
                 "communication_pct", "transfer_pct", "other_pct", "startup_s", "setup_s", "verify",
                 "peers")


def one_time_phases(run, wall):
    """The phases recorded once per run (setup, and collect after the repeats): from the
    scopes the file records; older files by the operation's declared phases or the NaN
    pattern (:func:`_setup_phases`)."""
    scopes = run.get("phase_scopes") or {}
    if scopes:
        return {p for p in run["phases"] if scopes.get(p) in ("setup", "after")}
    return _setup_phases(run["attrs"].get("operation", ""), run["phases"], wall)


def time_to_solution(run):
    """``tts_s``, ``startup_s``, ``setup_s`` and ``collect_s`` of one run (module docstring).

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
    setup_s = slowest([p for p in once if p not in collect and kinds.get(p) != "startup"])
    collect_s = slowest(collect)
    return {"tts_s": startup_s + setup_s + repeats_s + collect_s, "startup_s": startup_s,
            "setup_s": setup_s, "collect_s": collect_s, "repeats_s": repeats_s}


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
        ({category: seconds}, with ``other`` = total minus the phases),
        ``tts_s``/``startup_s``/``setup_s``/``collect_s``/``repeats_s`` (time to solution and its
        parts: one-time phases and collect, max over ranks, summed), ``peers``
        ({name: median seconds}), ``verify``.
    """
    run = read_results(path)
    a, phases = run["attrs"], run["phases"]
    wall = np.asarray(run["wall"], dtype=float)  # (repeats, ranks, phases)
    gpu = np.asarray(run["gpu"], dtype=float)
    compute_phases = tuple(p for p in str(a.get("compute_phases", "")).split(",") if p)
    total = wall[:, :, phases.index("total")]
    critical = np.argmax(np.where(np.isnan(total), -np.inf, total), axis=1)  # slowest rank
    repeats = np.arange(wall.shape[0])
    kinds = run.get("phase_kinds") or {}
    setup = one_time_phases(run, wall)
    per_repeat = [p for p in phases if p not in setup and p != "total"]
    phase_seconds = {}
    # GPU phases are launched asynchronously: their wall time is the launch, and the wait shows
    # up in whichever later phase synchronises. Their CUDA-event time is what they cost.
    timed = np.where(np.isfinite(gpu), gpu, wall)
    for p in per_repeat:
        values = timed[repeats, critical, phases.index(p)]
        if np.isfinite(values).any():
            phase_seconds[p] = float(np.median(np.nan_to_num(values)))
    total_s = float(np.median(total[repeats, critical]))
    categories = dict.fromkeys(CATEGORIES, 0.0)
    for p, seconds in phase_seconds.items():
        kind = kinds.get(p)
        if kind == "detail":  # already counted inside the phase that encloses it
            continue
        category = (kind if kind in CATEGORIES else "other") if kind else \
            phase_category(p, compute_phases)
        categories[category] += seconds
    counted = sum(v for p, v in phase_seconds.items() if kinds.get(p) != "detail")
    categories["other"] += max(0.0, total_s - counted)
    # Compute time per (repeat, rank) as the driver defines it: GPU-event time where recorded.
    imbalance = float("nan")
    if compute_phases and all(p in phases for p in compute_phases):
        cols = [phases.index(p) for p in compute_phases]
        chosen = np.where(np.isnan(gpu[:, :, cols]), wall[:, :, cols], gpu[:, :, cols])
        compute = np.nansum(chosen, axis=2)
        mean = compute.mean(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(mean > 0, compute.max(axis=1) / mean, np.nan)
        if np.isfinite(ratio).any():
            imbalance = float(np.nanmedian(ratio))
    peers = {name: float(info.get("median_seconds", np.nan)) for name, info in run["peers"].items()}
    verify = ("off" if not a.get("verify_enabled", True) else
              "ok" if a.get("verify_passed", False) else "FAIL")
    return {
        "file": path, "study_id": str(a.get("study_id", "")), "study": str(a.get("study", "")),
        "name": str(a.get("name", "")), "operation": str(a.get("operation", "")),
        "input": _short_input(a.get("input", "")), "backend": str(a.get("backend", "")),
        "precision": str(a.get("precision", "")), "nranks": int(a.get("nranks", wall.shape[1])),
        "nnodes": int(a.get("nnodes", 1)), "total_s": total_s,
        "compute_s": float(a.get("median_compute_seconds", np.nan)), "imbalance": imbalance,
        "phases": phase_seconds, "categories": categories, "peers": peers,
        "verify": verify, "created_utc": str(a.get("created_utc", "")),
        "repeats": int(wall.shape[0]), **time_to_solution(run),
    }


def _series_key(summary):
    # A weak study's input grows with the rank count: its runs form one series regardless.
    grown = summary["study"] == "weak" and summary["study_id"]
    return (summary["study_id"], summary["operation"], "" if grown else summary["input"],
            summary["backend"], summary["precision"], summary["name"])


def study_rows(paths, kind=None):
    """One row per (series, rank count), ordered by series then ranks.

    Parameters
    ----------
    paths : list of str
        Results files or directories.
    kind : {"strong", "weak"}, optional
        Formula for runs marked ``single`` (default strong); runs marked strong/weak use their own.

    Returns
    -------
    list of dict
        The :data:`STUDY_COLUMNS` plus ``phases``, ``categories``, ``peer_<name>_s`` and
        ``series`` (a label).
    """
    series = {}
    for path in expand_paths(paths, results_only=True):
        try:
            summary = run_summary(path)
        except (OSError, KeyError, ValueError) as exc:
            raise InputError(f"{path}: not a hisparse results file ({exc})") from None
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
        study = runs[0]["study"] if runs[0]["study"] in ("strong", "weak") else (kind or "strong")
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
            total = run["total_s"]
            row = dict(run, study=study, series=label, speedup=speedup, efficiency=efficiency,
                       compute_speedup=compute_speedup, compute_efficiency=compute_efficiency,
                       tts_speedup=tts_speedup, tts_efficiency=tts_efficiency)
            for cat in CATEGORIES:
                row[f"{cat}_part_s"] = run["categories"][cat]
                row[f"{cat}_pct"] = 100.0 * run["categories"][cat] / total if total > 0 else np.nan
            for name, seconds in run["peers"].items():
                row[f"peer_{name}_s"] = seconds
            row["peers"] = ", ".join(f"{name} {_fmt(seconds)}s" for name, seconds in
                                     sorted(run["peers"].items())) or "-"
            rows.append(row)
    return rows


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
    columns = [c for c in STUDY_COLUMNS if c != "peers"] + ["precision", "name"] + \
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
           no_plots=False, stdout=None, stderr=None):
    """What ``hisparse report`` does; returns the exit status.

    Prints the study table when the runs belong to a strong or weak study (or with ``study``),
    else one row per run. ``output`` writes ``report.txt``, ``study.csv``, ``runs.csv`` and the
    plots into a directory; ``plots`` writes only the plots.
    """
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    runs = run_rows(paths)
    aggregate = study or (not per_run and any(_run_study(r["file"]) in ("strong", "weak")
                                              for r in runs))
    rows = study_rows(paths) if aggregate else []
    if csv_out:
        text = format_study_csv(rows) if aggregate else format_csv(runs)
        stdout.write(text)
    else:
        text = format_study_table(rows) if aggregate else format_table(runs)
        stdout.write(text + "\n")
    notes = missing_runs(paths, rows) if aggregate else []
    notes += missing_part_notes(runs)
    for line in notes:
        stderr.write(f"hisparse report: warning: {line}\n")
    if output:
        os.makedirs(output, exist_ok=True)
        files = {"runs.csv": format_csv(runs)}
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
            rows = study_rows(paths)
        try:
            for path in write_plots(rows, plot_dir):
                stderr.write(f"hisparse report: wrote {path}\n")
        except ImportError:
            stderr.write("hisparse report: plots skipped: matplotlib is not installed "
                         "(pip install 'hisparse[plots]')\n")
    return 0


def _run_study(path):
    import h5py
    with h5py.File(path, "r") as handle:
        value = handle.attrs.get("study", "")
    return value.decode() if isinstance(value, bytes) else str(value)

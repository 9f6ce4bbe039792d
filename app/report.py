"""``hisparse report``: tabulate results files (one row per run)."""
import csv
import glob
import io
import os

import numpy as np

from .errors import InputError
from .io import read_results

COLUMNS = ("operation", "input", "nranks", "backend", "precision", "median_s", "compute_s",
           "gflops", "gbs", "roofline", "imbalance", "verify", "peer", "peer_s", "speedup")


def expand_paths(paths):
    """Results files named directly, or found (recursively) under directories."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(glob.glob(os.path.join(path, "**", "*.h5"), recursive=True))
        elif os.path.exists(path):
            files.append(path)
        else:
            raise InputError(f"{path}: no such results file or directory")
    if not files:
        raise InputError(f"no results files (*.h5) under {', '.join(paths)}")
    return files


def _short_input(text):
    text = str(text)
    return os.path.basename(text) if not text.startswith("generate:") else text[:40]


def run_rows(paths):
    """One dict per (run, peer) with the columns of :data:`COLUMNS`."""
    rows = []
    for path in expand_paths(paths):
        try:
            run = read_results(path)
        except (OSError, KeyError) as exc:
            raise InputError(f"{path}: not a hisparse results file ({exc})") from None
        a = run["attrs"]
        base = {
            "file": path, "operation": a.get("operation", ""), "input": _short_input(a.get("input", "")),
            "nranks": int(a.get("nranks", 0)), "backend": a.get("backend", ""),
            "precision": a.get("precision", ""),
            "median_s": float(a.get("median_total_seconds", np.nan)),
            "compute_s": float(a.get("median_compute_seconds", np.nan)),
            "gflops": float(a.get("gflops", np.nan)), "gbs": float(a.get("gbytes_per_second", np.nan)),
            "roofline": float(a.get("roofline_fraction", np.nan)),
            "imbalance": float(a.get("load_imbalance", np.nan)),
            "verify": ("off" if not a.get("verify_enabled", True) else
                       ("ok" if a.get("verify_passed", False) else "FAIL")) +
                      (f" {float(a['verify_max_rel_error']):.1e}" if a.get("verify_enabled", True)
                       and "verify_max_rel_error" in a else ""),
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

"""One compact summary per results file: compute and total per repeat, per-phase medians
(ms), the peers' times and ratios, and the headline attributes. Usage:

    python jobs/bench_summary.py RESULTS_DIR_OR_FILES...
"""
import glob
import os
import sys

import numpy as np

from hisparse.io import read_results

KEYS = ("csr5_spmv", "convert", "analysis", "ordering", "symbolic", "numeric", "solve",
        "peak_device", "time_to_solution", "mttkrp", "iteration", "setup")


def _median_ms(run, phase):
    """Rank 0's median seconds of ``phase`` over the repeats, in ms (GPU time where timed)."""
    index = run["phases"].index(phase)
    gpu, wall = run["gpu"][:, 0, index], run["wall"][:, 0, index]
    values = np.where(np.isfinite(gpu), gpu, wall)
    return round(float(np.nanmedian(values)) * 1e3, 4) if np.isfinite(values).any() else None


def summarize(path):
    run = read_results(path)
    attrs = run["attrs"]
    phases = {p: _median_ms(run, p) for p in run["phases"]
              if run["phase_scopes"].get(p) == "repeat" and p != "total"}
    peers = {k: v for k, v in attrs.items() if k.startswith(("peer_", "speedup_vs"))}
    extra = {k: v for k, v in attrs.items() if any(s in k for s in KEYS)}
    lines = [f"{attrs['operation']} {attrs['name']} ranks={attrs.get('nranks', '?')} "
             f"compute_ms={attrs['median_compute_seconds'] * 1e3:.4f} "
             f"total_ms={attrs['median_total_seconds'] * 1e3:.4f} "
             f"gflops={attrs.get('gflops', 0):.1f} verify={attrs.get('verify_passed')}",
             f"   phases_ms {phases}", f"   peers {peers}", f"   extra {extra}"]
    nodes = run.get("rank_vars", {}).get("graph_nodes")
    if nodes is not None:
        lines.append(f"   graph_nodes {np.asarray(nodes).tolist()}")
    return "\n".join(lines)


def main(arguments):
    paths = []
    for argument in arguments:
        paths += sorted(glob.glob(os.path.join(argument, "*.h5"))) if os.path.isdir(argument) \
            else [argument]
    for path in paths:
        print(summarize(path))


if __name__ == "__main__":
    main(sys.argv[1:])

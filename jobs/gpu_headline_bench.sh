#!/bin/bash
# The headline benchmark configs of docs/ops/*.md, one run each, and a one-line summary per run
# (compute time, per-phase medians, peers). On the GPU machine, from the project root:
#   OUT=/tmp/out bash jobs/gpu_headline_bench.sh
set -u
OUT=${OUT:-results}
export OUT
B=(--set "output.dir=$OUT/bench" --quiet)
timeout 90 hisparse run inputs/bench_spmv_poisson27.yaml "${B[@]}"
timeout 90 hisparse run inputs/bench_spgemm_poisson27_128.yaml "${B[@]}" --set operation.params.keep_distributed=false --set verify.enabled=false
timeout 120 hisparse run inputs/bench_cpals_nell2_20m.yaml "${B[@]}"
timeout 150 hisparse run inputs/bench_sptv_nell2_resident.yaml "${B[@]}" --set 'peers=[cusparse_fibers]' --set operation.params.sweep=false --set verify.enabled=false
timeout 120 hisparse run inputs/bench_cholesky_trefethen20000.yaml "${B[@]}" --set 'peers=[]'
python3 - <<'PY' > "$OUT/bench.txt"
import glob, os, numpy as np
from hisparse.io import read_results
for f in sorted(glob.glob(os.environ["OUT"] + "/bench/*.h5")):
    r = read_results(f); a = r["attrs"]; ph = r["phases"]
    g, w = r["gpu"], r["wall"]
    def med(p):
        i = ph.index(p); x = np.where(np.isfinite(g[:, 0, i]), g[:, 0, i], w[:, 0, i])
        return float(np.nanmedian(x)) if np.isfinite(x).any() else float("nan")
    per = {p: round(med(p) * 1e3, 4) for p in ph if r["phase_scopes"].get(p) == "repeat" and p != "total"}
    peers = {k: v for k, v in a.items() if k.startswith("peer_") or k.startswith("speedup_vs")}
    extra = {k: v for k, v in a.items() if any(s in k for s in ("csr5_spmv", "convert", "analysis", "numeric", "solve", "peak_device", "time_to_solution", "mttkrp", "iteration"))}
    print(a["operation"], a["name"], "compute_ms", round(a["median_compute_seconds"] * 1e3, 4), "total_ms", round(a["median_total_seconds"] * 1e3, 4), "gflops", round(a.get("gflops", 0), 1), "verify", a.get("verify_passed"), a.get("verify_max_rel_error"))
    print("   phases_ms", per); print("   peers", peers); print("   extra", extra)
PY
cat "$OUT/bench.txt"

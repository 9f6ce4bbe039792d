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
python3 jobs/bench_summary.py "$OUT/bench" > "$OUT/bench.txt"
cat "$OUT/bench.txt"

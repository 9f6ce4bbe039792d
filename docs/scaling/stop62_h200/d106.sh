#!/bin/bash
# Stop 62, call 2 (one H200): the GPU time of CP-ALS's dense steps (solve_rows,
# normalize_factor, gram_inverse) beside the MTTKRP, from Nsight Compute inside a real 1-rank
# run of the 20M benchmark (graphs on: each kernel node), and the run's per-repeat total with
# and without graphs.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d106.log) 2>&1
P=docs/scaling/stop55_x2/phases.py
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --quiet"
for g in true false; do
  d=$OUT/r_$g; mkdir -p $d
  timeout 120 python3 -m hisparse run $C --set run.repeats=5 --set gpu.graphs=$g --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== graphs $g"; python3 $P $d/*.h5 | grep -E "tts|  (mttkrp|solve|exchange|gram|iteration|total)  "
  rm -f $d/*.h5
done
timeout 300 ncu --clock-control none -k 'regex:normalize_factor|solve_rows|gram_inverse|mttkrp_nnz_team' \
  --launch-skip 120 --launch-count 24 --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
  python3 -m hisparse run $C --set run.repeats=1 --set run.warmup=1 --set output.dir=$OUT/r_ncu > $OUT/ncu.txt 2>&1
grep -E "normalize_factor|solve_rows|gram_inverse|mttkrp_nnz_team|gpu__time_duration|launch__grid_size" $OUT/ncu.txt | head -80
tail -3 $OUT/ncu.txt
date

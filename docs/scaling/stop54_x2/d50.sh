#!/bin/bash
# session 54, call 6 (x2): the distributed solve's split per rank (chol_solve_subtree_seconds:
# the subtrees' dataflow passes by CUDA events; the rest of the solve phase is the top
# supernodes and the exchanges) -- the subtree GPU tests, then grid 2000^2 and 120^3 at 2 GPUs
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d50.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 150 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky_subtree.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
for m in grid2000 lap120; do
  d=$OUT/r/$m; mkdir -p $d
  timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set peers=[] --set run.repeats=5 --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "2 ranks: $(python3 .device/cholsum.py $d/*.h5)"
  python3 .device/phases.py $d/*.h5 | grep -E "  (numeric|solve|refine|d2h|total)  |chol_solve_subtree|chol_(subtree|top|exchange)_seconds"
done
date

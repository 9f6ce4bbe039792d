#!/bin/bash
# session 54, call 7 (x2): the distributed solve's right-hand sides in and solution out by the
# owned columns' runs (no n x k host array a solve) -- the subtree GPU tests, a one-rank run
# (the refactored upload), then 2 GPUs on 120^3 and grid 2000^2, verified, with the solve split
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d51.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 110 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky_subtree.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
for case in 1:lap120 2:lap120 2:grid2000; do
  n=${case%:*}; m=${case#*:}
  d=$OUT/r/${n}_$m; mkdir -p $d
  timeout 45 $M -n $n hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set peers=[] --set run.repeats=5 --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "$n ranks: $(python3 .device/cholsum.py $d/*.h5)"
  python3 .device/phases.py $d/*.h5 | grep -E "  (h2d|numeric|solve|refine|d2h|total)  |chol_solve_subtree"
done
date

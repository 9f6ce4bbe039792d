#!/bin/bash
# session 54, call 1 (x2): the whole GPU suite on stop 53's last commits (the review mend, the
# writer's chunks, R-MAT's buffer were not run on a GPU), then the ordering's level-set
# tolerance A/B at ONE rank (issue 34: single-GPU numbers within 5 % of the issue's table)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d45.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 380 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite.log 2>&1
tail -3 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
V="--set peers=[] --set run.repeats=3 --quiet"
for case in grid2000:0 grid2000:0.05 lap120:0 lap120:0.05 grid2000:0 grid2000:0.05; do
  m=${case%:*}; tol=${case#*:}
  d=$OUT/ab/${m}_$tol; mkdir -p $d
  timeout 60 $M -n 1 python3 .device/tol_run.py $tol run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d > $OUT/last.log 2>&1 || tail -30 $OUT/last.log
  echo "1 rank tol $tol: $(python3 .device/cholsum.py $d/*.h5)"; rm -f $d/*.h5
done
date

#!/bin/bash
# session 53, call 3 (x2): the ordering's level-set tolerance A/B (0 = stop 52's rule, 0.05 =
# this stop's) on the 2-D grid 2000^2 and the Laplacian 120^3 at 2 ranks, verified, alternated
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d38.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
V="--set peers=[] --set run.repeats=2 --quiet"
for case in grid2000:0 grid2000:0.05 lap120:0 lap120:0.05 grid2000:0 grid2000:0.05 lap120:0 lap120:0.05; do
  m=${case%:*}; tol=${case#*:}
  d=$OUT/ab/${m}_$tol; mkdir -p $d
  timeout 90 $M -n 2 python3 .device/tol_run.py $tol run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d > $OUT/last.log 2>&1 || tail -30 $OUT/last.log
  echo "tol $tol: $(python3 .device/cholsum.py $d/*.h5)"; rm -f $d/*.h5
done
for m in grid2000 lap120; do
  d=$OUT/one/$m; mkdir -p $d
  timeout 90 $M -n 1 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d > $OUT/last.log 2>&1 || tail -30 $OUT/last.log
  echo "1 rank: $(python3 .device/cholsum.py $d/*.h5)"
done
python3 .device/phases.py $OUT/one/*/*.h5 > $OUT/phases_one.txt 2>&1; rm -f $OUT/one/*/*.h5
date

#!/bin/bash
# session 48, call 1 (x2): whole GPU suite (4 host commits untested on GPU); R-MAT 23 and lap120 set-up at 1/2 ranks after group_pairs, balance no-copy, config warm-up
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d5.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
S="--set peers=[] --set verify.enabled=false --set run.repeats=5"
date
timeout 390 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests 2>&1 | grep -v Warn | tail -8
date
for n in 1 2; do
$M -n $n hisparse run inputs/bench_spmv_rmat.yaml $S --set input.generate.scale=20 --set run.repeats=1 --set output.dir=/tmp/p > /dev/null 2>&1
done
$M -n 2 hisparse run inputs/bench_cholesky_lap120_multigpu.yaml $S --set 'input.generate.dims=[30,30,30]' --set output.dir=/tmp/p > /dev/null 2>&1
for n in 1 2; do timeout 30 $M -n $n hisparse run inputs/bench_spmv_rmat.yaml $S --set input.generate.scale=23 --set output.dir=$OUT/rmat > /dev/null 2>&1; done
for n in 1 2; do timeout 30 $M -n $n hisparse run inputs/bench_cholesky_lap120_multigpu.yaml $S --set output.dir=$OUT/chol > /dev/null 2>&1; done
date
hisparse report --setup $OUT/rmat $OUT/chol
python3 .device/phases.py $OUT/rmat/*.h5 $OUT/chol/*.h5 2>&1 | grep -vE "peak_host"
rm -f $OUT/*/*.h5
date

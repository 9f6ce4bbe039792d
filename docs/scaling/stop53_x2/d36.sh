#!/bin/bash
# session 53, call 1 (x2): the whole GPU suite on stop 52's last commits, verified 2-rank runs
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d36.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 400 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite.log 2>&1
tail -3 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
mkdir -p $OUT/v
V="--set peers=[] --set run.repeats=2 --set output.dir=$OUT/v"
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml $V 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_rmat.yaml --set input.generate.scale=21 $V 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 40 $M -n 2 hisparse run inputs/bench_spgemm_rmat18.yaml $V 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 40 $M -n 2 hisparse run inputs/bench_sptv_nell2_multigpu.yaml $V 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 90 $M -n 2 hisparse run inputs/bench_cpals_nell2_20m.yaml $V --set verify.enabled=true 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_lap120_multigpu.yaml $V 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
rm -f $OUT/v/*.h5
date

#!/bin/bash
# session 51, call 4 (x2): the whole GPU suite on this session's code (few-ghost split, NCCL
# binding, Cholesky pattern steps, every rank's own copy of A), verified 2-rank runs
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d28.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 400 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite.log 2>&1
tail -4 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
mkdir -p $OUT/o
for m in lap120 grid2000; do
  timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set operation.params.ordering_file=$OUT/o/$m.h5 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
done
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_rmat.yaml --set input.generate.scale=21 --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 40 $M -n 2 hisparse run inputs/bench_spgemm_rmat18.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
rm -f $OUT/o/*.h5
date

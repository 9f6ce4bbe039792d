#!/bin/bash
# session 52, call 1 (x2): the whole GPU suite on stop 51's last commits (make_rhs, warm-up
# order, auto_strategy, review mend), verified 2-rank runs (results kept for their set-up
# steps), a 1-rank Cholesky 2000² with the saved ordering beside them, the tensor generator probe
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d31.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
python3 docs/scaling/stop52_x2/probe52.py > $OUT/probe52.log 2>&1; grep -E "^(cupy|kernel|sptv|cpals)" $OUT/probe52.log
timeout 400 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite.log 2>&1
tail -4 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
mkdir -p $OUT/o $OUT/v
for m in lap120 grid2000; do
  timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=$OUT/v --set operation.params.ordering_file=$OUT/o/$m.h5 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
done
for n in 1 2; do
  timeout 60 $M -n $n hisparse run inputs/bench_cholesky_grid2000_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=$OUT/v --set operation.params.ordering_file=$OUT/o/grid2000.h5 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
done
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=$OUT/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_rmat.yaml --set input.generate.scale=21 --set 'peers=[]' --set run.repeats=2 --set output.dir=$OUT/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
timeout 40 $M -n 2 hisparse run inputs/bench_spgemm_rmat18.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=$OUT/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
python3 .device/phases.py $OUT/v/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|prepare|distribute|analysis|startup  |chol_setup" $OUT/phases.txt | grep -A40 "== chol_grid" | head -70
rm -f $OUT/o/*.h5 $OUT/v/*.h5
date

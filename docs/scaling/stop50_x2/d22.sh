#!/bin/bash
# session 50, call 3 (x2): with the rank-0 passes compiled (rank_rows, the entries' grouping):
# verified 2-rank Cholesky runs, a cProfile of the 2-rank grid 2000^2 set-up on each rank, and
# the saved-ordering series at 1/2 GPUs again
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d22.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
mkdir -p $OUT/o
for m in lap120 grid2000; do
  timeout 100 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set operation.params.ordering_file=$OUT/o/$m.h5 2>&1 | grep -E "ok|FAIL|rror" | cut -c1-220
done
date
timeout 60 $M -n 2 python3 .device/prof_run.py run inputs/bench_cholesky_grid2000_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set verify.enabled=false --set operation.params.ordering_file=$OUT/o/grid2000.h5 2>&1 | grep -v "^cholesky\|^\[" > $OUT/prof.txt
grep -A60 "===== rank 0" $OUT/prof.txt | head -62
grep -A60 "===== rank 1" $OUT/prof.txt | head -62
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
for m in lap120 grid2000; do
  timeout 100 $D --timeout 45 --id chol_${m}_saved --set operation.params.ordering_file=$OUT/o/$m.h5 inputs/bench_cholesky_${m}_multigpu.yaml > $OUT/c_$m.log 2>&1
done
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -8
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*r2*.h5 2>&1 | grep -E "==|chol_setup|setup  |symbolic_|analysis_seconds"
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

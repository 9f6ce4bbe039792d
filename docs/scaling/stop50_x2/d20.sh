#!/bin/bash
# session 50, call 1 (x2): the whole GPU suite on stop 49's code (untested: 519511d, 31cb8d1,
# 4cd9894, 705d6c6) plus the early NCCL import; verified 2-rank SpMV 160^3 and R-MAT 21 runs;
# SpMV 160^3 at 1/2 (connect); Cholesky 120^3 and 2000^2 with a saved ordering at 1/2 (set-up)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d20.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 330 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests 2>&1 | grep -v Warn | tail -6
date
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -2
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_rmat.yaml --set input.generate.scale=21 --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -2
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s1.log 2>&1
mkdir -p $OUT/o
for m in lap120 grid2000; do
  timeout 100 $D --timeout 45 --id chol_${m}_saved --set operation.params.ordering_file=$OUT/o/$m.h5 inputs/bench_cholesky_${m}_multigpu.yaml > $OUT/c_$m.log 2>&1
done
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-260 $OUT/s/report.txt | head -14
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -v "^    [a-z_]*plan_" | head -150
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

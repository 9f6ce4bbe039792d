#!/bin/bash
# session 48, call 6 (x2): split loops loaded during the read: a verified 2-rank SpMV run (GPU, NCCL), 160^3 at 1/2
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d10.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -4
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s1.log 2>&1
hisparse report --setup $OUT/s | cut -c1-200
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|plan_split|plan  |read  |connect"
rm -f $OUT/s/*.h5
date

#!/bin/bash
# session 49, call 6 (x2): the real 2-rank run's split timed per step, twice
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d16.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -n 2"
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set verify.enabled=false --set run.repeats=1"
date
for k in 1 2 3; do timeout 30 $M python3 .device/run_split_timed.py run $S --set output.dir=/tmp/a 2>&1 | grep threads; done
date

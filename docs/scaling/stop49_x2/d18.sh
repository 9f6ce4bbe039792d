#!/bin/bash
# session 49, call 8 (x2): A/B/C of the split loader's start (early / before read / none), SpMV 160^3 at 2 ranks, alternated x3
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d18.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -n 2"
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set verify.enabled=false --set run.repeats=2"
date
timeout 30 $M hisparse run $S --set output.dir=/tmp/p > /dev/null 2>&1
for k in 1 2 3; do for m in early read none; do
timeout 30 $M -x MODE=$m python3 .device/run_loader_mode.py run $S --set output.dir=$OUT/$m > /dev/null 2>&1
done; done
date
for m in early read none; do echo "### $m"; hisparse report --setup $OUT/$m | cut -c1-200 | tail -n +3; python3 .device/phases.py $OUT/$m/*.h5 2>&1 | grep -E "plan_loaded|plan_split"; done
rm -f $OUT/*/*.h5
date

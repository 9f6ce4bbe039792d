#!/bin/bash
# session 49, call 4 (x2): does NCCL's background connection slow the 2-rank split? SpMV 160^3 2 ranks: default / connect waited after read / MPI transport
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d14.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -n 2"
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set verify.enabled=false --set run.repeats=1"
date
timeout 30 $M hisparse run $S --set output.dir=/tmp/p > /dev/null 2>&1
for k in 1 2; do
timeout 30 $M hisparse run $S --set output.dir=$OUT/a > /dev/null 2>&1
timeout 30 $M python3 .device/run_patched.py run $S --set output.dir=$OUT/b > /dev/null 2>&1
timeout 30 $M hisparse run $S --set parallel.transport=mpi --set output.dir=$OUT/c > /dev/null 2>&1
done
date
for d in a b c; do echo "### $d"; python3 .device/phases.py $OUT/$d/*.h5 2>&1 | grep -E "==|plan  |connect|upload|plan_split|plan_totals"; done
rm -f $OUT/*/*.h5
date

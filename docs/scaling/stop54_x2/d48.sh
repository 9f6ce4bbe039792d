#!/bin/bash
# session 54, call 4 (x2): why SpMV 160^3's 2-rank split (plan_split) took 0.30-0.35 s on the
# file input in d46 against 0.08 s in d42 and 0.012 s at one rank: the file and the generated
# input at 2 ranks, each rank's plan profiled (cProfile, main thread)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d48.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set run.repeats=2 --set verify.enabled=false --quiet"
for src in file gen file gen; do
  X=""; [ $src = file ] && X="--set input.path=/tmp/p160.h5"
  d=$OUT/$src; mkdir -p $d
  timeout 60 $M -n 2 hisparse run $S $X --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $src"; python3 .device/phases.py $d/*.h5 | grep -E "  (read|plan|upload)  |plan_"; rm -f $d/*.h5
done
timeout 90 $M -n 2 python3 .device/prof_plan.py run $S --set input.path=/tmp/p160.h5 --set output.dir=$OUT/p 2>&1 | grep "rank" | head -90
date

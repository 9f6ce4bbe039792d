#!/bin/bash
# Stop 57, call 2 (2xH200): why R-MAT 23's plan and upload grew at 2 GPUs with the rows made on
# every GPU (d64: plan 1.90 -> 5.41 s, upload 0.08 -> 1.82 s): every phase and plan step, and a
# profile of each rank's main thread.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
timeout 60 $MP -n 1 hisparse run inputs/bench_spmv_rmat.yaml --set input.generate.scale=18 $S --set output.dir=$OUT/w > /dev/null 2>&1
for n in 2 1; do
  timeout 120 $MP -n $n hisparse run $R $S --set output.dir=$OUT/n$n > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  python3 $P $OUT/n$n/*.h5; rm -f $OUT/n$n/*.h5
done
timeout 120 $MP -n 2 python3 docs/scaling/stop55_x2/prof_rmat.py run $R $S --set output.dir=$OUT/p > $OUT/prof.log 2>&1
grep -v "^\[rank 1\]" $OUT/prof.log | head -45; grep "^\[rank 1\]" $OUT/prof.log | head -30
rm -f $OUT/p/*.h5

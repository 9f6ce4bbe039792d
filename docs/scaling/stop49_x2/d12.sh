#!/bin/bash
# session 49, call 2 (x2): SpMV 160^3 and R-MAT 23 at 1/2 ranks after the split loader (stop 48 item 4): set-up per rank
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d12.log) 2>&1
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 120 $D --timeout 50 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s2.log 2>&1
date
hisparse report --setup $OUT/s | cut -c1-230
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup|connect|read|plan|upload|probe|graph|generate"
rm -f $OUT/s/*.h5
date

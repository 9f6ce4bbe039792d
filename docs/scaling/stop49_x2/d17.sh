#!/bin/bash
# session 49, call 7 (x2): GPU tests of SpMV (the split loops loaded from the start-up), a verified 2-rank run, SpMV 160^3 and R-MAT 23 at 1/2, R-MAT 23's plan pieces at 2 ranks
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d17.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 150 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py tests/test_spmv_checkerboard.py tests/test_spmv.py 2>&1 | grep -v Warn | tail -3
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -2
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s2.log 2>&1
timeout 120 $D --timeout 50 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
date
timeout 50 $M -n 2 python3 .device/plan_patch.py run inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set peers=[] --set verify.enabled=false --set run.repeats=1 --set output.dir=/tmp/pp 2>&1 | grep -E "^r[01] "
timeout 50 $M -n 1 python3 .device/plan_patch.py run inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set peers=[] --set verify.enabled=false --set run.repeats=1 --set output.dir=/tmp/pp 2>&1 | grep -E "^r[01] "
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-260 $OUT/s/report.txt | head -30
hisparse report --setup $OUT/s | cut -c1-230
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup  |connect|read  |plan|upload|probe|graph"
rm -f $OUT/s/*.h5
date

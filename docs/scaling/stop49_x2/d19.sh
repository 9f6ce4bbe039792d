#!/bin/bash
# session 49, call 9 (x2): the crossing-rows split (no Numba at 2 ranks of a mesh), loader removed: GPU tests of distributed SpMV, a verified 2-rank run, SpMV 160^3 and R-MAT 23 at 1/2
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d19.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -2
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s2.log 2>&1
timeout 110 $D --timeout 45 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-260 $OUT/s/report.txt | head -12
hisparse report --setup $OUT/s | cut -c1-230
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup  |connect|read  |plan|upload|probe|graph"
rm -f $OUT/s/*.h5
date
timeout 100 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py 2>&1 | grep -v Warn | tail -3
date

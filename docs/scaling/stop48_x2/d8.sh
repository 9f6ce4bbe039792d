#!/bin/bash
# session 48, call 4 (x2): early CuPy/NCCL import + deferred connect: transport GPU tests, a verified 2-rank SpMV run, three series at 1/2
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d8.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 100 python3 -m pytest -m gpu -n 4 -q -o addopts="" -p no:cacheprovider tests/test_transport_gpu.py 2>&1 | grep -v Warn | tail -3
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -iE "verif|error" | head -5
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 200 $D --timeout 30 inputs/bench_spmv_scaling.yaml inputs/bench_cpals_nell2_20m.yaml inputs/bench_sptv_nell2_multigpu.yaml > $OUT/s1.log 2>&1
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cat $OUT/s/report.txt | cut -c1-200
hisparse report --setup $OUT/s
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup  |connect|read|plan |upload|probe|graph|startup_"
rm -f $OUT/s/*.h5
date

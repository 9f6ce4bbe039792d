#!/bin/bash
# session 48, call 3 (x2): GPU tests (split, alltoall_concatenated, deferred connect); R-MAT 23 + SpMV 160^3 at 1/2 after the changes; R-MAT generation steps at 2
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d7.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py tests/test_transport_gpu.py tests/test_spmv_checkerboard.py tests/test_parallel_input.py tests/test_generators.py 2>&1 | grep -v Warn | tail -4
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 120 $D --timeout 50 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s2.log 2>&1
date
timeout 40 $M -n 2 python3 .device/gen_probe.py 23
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cat $OUT/s/report.txt | cut -c1-200
hisparse report --setup $OUT/s
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup  |connect|read|plan|upload|probe|graph|convert|startup_"
rm -f $OUT/s/*.h5
date

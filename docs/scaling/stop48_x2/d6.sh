#!/bin/bash
# session 48, call 2 (x2): GPU tests of the compiled split; NCCL connect steps; R-MAT 23 + four small series set-up at 1/2 ranks; R-MAT generation steps
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d6.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py tests/test_spmv_checkerboard.py tests/test_spmv.py 2>&1 | grep -v Warn | tail -4
date
for k in 1 2; do timeout 30 $M -n 2 python3 .device/connect_probe.py; done
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 120 $D --timeout 50 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
date
timeout 150 $D --timeout 30 inputs/bench_spmv_scaling.yaml inputs/bench_sptv_nell2_multigpu.yaml inputs/bench_cpals_nell2_20m.yaml inputs/bench_spgemm_rmat18.yaml > $OUT/s2.log 2>&1
date
for n in 1 2; do timeout 40 $M -n $n python3 .device/gen_probe.py 23; done
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cat $OUT/s/report.txt | cut -c1-260
hisparse report --setup $OUT/s
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|startup  |connect|read|plan|upload|probe|graph|convert|partition|distribute|startup_"
rm -f $OUT/s/*.h5
date

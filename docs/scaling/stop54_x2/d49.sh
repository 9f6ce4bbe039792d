#!/bin/bash
# session 54, call 5 (x2): SpMV's split no longer waits for the compiled passes' loading where it
# does not take them -- the SpMV GPU tests, then the file input (27-pt 160^3) at 1 and 2 GPUs
# (the study, primed), and the 2-rank plan split of the file beside the generated stencil
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d49.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv.py tests/test_spmv_distributed.py tests/test_spmv_checkerboard.py tests/test_spmv_csr5.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -4
python3 .device/phases.py $OUT/s/*.h5 | grep -E "==|startup  |  read|plan  |upload|probe|prepare|total  |plan_"
rm -f $OUT/s/*.h5
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set run.repeats=2 --quiet"
for src in file gen file gen; do
  X=""; [ $src = file ] && X="--set input.path=/tmp/p160.h5"
  d=$OUT/$src; mkdir -p $d
  timeout 60 $M -n 2 hisparse run $S $X --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $src (verified)"; python3 .device/phases.py $d/*.h5 | grep -E "  (read|plan|upload)  |plan_split"; rm -f $d/*.h5
done
date

#!/bin/bash
# session 53, call 7 (x2): issue 33's file input at 1 and 2 GPUs (SpMV 27-pt 160^3 written to HDF5
# by hisparse generate, then read by every run), and the R-MAT 23 SpMV series (row blocks and
# the checkerboard), each primed at both rank counts; per-rank set-up phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d42.log) 2>&1
date
timeout 120 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
ls -la /tmp/p160.h5; date
timeout 200 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
date
timeout 330 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only rmat > $OUT/study_rmat.log 2>&1 || tail -20 $OUT/study_rmat.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-220 $OUT/s/report.txt | head -16
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|upload|plan  |prepare|probe|connect|total  " $OUT/phases.txt | head -90
rm -f $OUT/s/*.h5
date

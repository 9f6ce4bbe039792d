#!/bin/bash
# session 54, call 2 (x2): what stop 53 left unmeasured on a GPU host: the file input written in
# 1 MiB chunks (SpMV 27-pt 160^3, 1 and 2 GPUs), R-MAT 23 with the per-thread draw buffer
# (row blocks), and Cholesky's series at 1 and 2 GPUs (ordering computed, then saved) with each
# rank's numeric split (subtrees / tops / exchange)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d46.log) 2>&1
date
timeout 120 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
ls -la /tmp/p160.h5; date
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
date
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --timeout 140 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/study_rmat.log 2>&1 || tail -20 $OUT/study_rmat.log
date
timeout 250 bash jobs/scaling_study.sh -o $OUT/c --ranks 1,2 --gpus 2 --only cholesky > $OUT/study_chol.log 2>&1 || tail -20 $OUT/study_chol.log
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-220 $OUT/s/report.txt | head -8
hisparse report $OUT/c --no-plots --output $OUT/c > /dev/null 2>&1
cut -c1-220 $OUT/c/report.txt | head -12
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases_s.txt 2>&1
python3 .device/phases.py $OUT/c/*.h5 > $OUT/phases_c.txt 2>&1
python3 .device/cholsum.py $OUT/c/*.h5 > $OUT/cholsum.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|upload|plan  |prepare|probe|connect|generate|total  " $OUT/phases_s.txt | head -60
grep -E "==|chol_subtree_seconds|chol_top_seconds|chol_exchange_seconds|numeric  " $OUT/phases_c.txt | head -60
rm -f $OUT/s/*.h5 $OUT/c/*.h5
date

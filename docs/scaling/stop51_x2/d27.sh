#!/bin/bash
# session 51, call 3 (x2): the strong series at 1/2 GPUs with this session's set-up changes
# (split, NCCL binding, Cholesky pattern), per-rank set-up phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d27.log) 2>&1
date
timeout 420 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only strong > $OUT/study.log 2>&1
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -14
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup_|  startup|  read|  plan|  upload|  connect|  prepare|  partition|  distribute" $OUT/phases.txt | head -150
rm -f $OUT/s/*.h5
date

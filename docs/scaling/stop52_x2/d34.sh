#!/bin/bash
# session 52, call 6 (x2): the whole GPU suite on the session's code (the device generator), then
# the strong series at 1 and 2 GPUs with the per-rank set-up phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d34.log) 2>&1
date
timeout 380 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite.log 2>&1
tail -3 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 190 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only strong > $OUT/study.log 2>&1
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -24
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|format|upload|plan  |prepare" $OUT/phases.txt
rm -f $OUT/s/*.h5
date

#!/bin/bash
# session 51, call 5 (x2): the strong series and Cholesky's saved-ordering series at 1/2 GPUs on
# the session's final code, per-rank set-up phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d29.log) 2>&1
date
timeout 200 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only strong > $OUT/study.log 2>&1
date
mkdir -p $OUT/o
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
for m in grid2000 lap120; do
  timeout 110 $D --timeout 45 --id chol_${m}_saved --set operation.params.ordering_file=$OUT/o/$m.h5 inputs/bench_cholesky_${m}_multigpu.yaml > $OUT/c_$m.log 2>&1
done
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -20
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|chol_setup|chol_prepare|  distribute|  analysis|  startup  " $OUT/phases.txt | grep -A30 "== chol" | head -60
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

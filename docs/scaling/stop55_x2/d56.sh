#!/bin/bash
# session 55, call 5 (x2): R-MAT edges by the compiled block (one word an edge) against stop 54's;
# the strong and R-MAT series at 1 and 2 GPUs (jobs/scaling_study.sh) and the 160^3 file input
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d56.log) 2>&1
date
mkdir -p /tmp/oldgen && tar -xzf .device/oldapp.tar.gz -C /tmp/oldgen
python3 .device/rmat_ab.py old 12 > /dev/null 2>&1; python3 .device/rmat_ab.py new 12 > /dev/null 2>&1
for w in old new; do
  timeout 60 python3 .device/rmat_ab.py $w 23
  (timeout 60 python3 .device/rmat_ab.py $w 23 0 & timeout 60 python3 .device/rmat_ab.py $w 23 1; wait)
done
date
timeout 420 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only strong --only rmat > $OUT/study.log 2>&1 || tail -20 $OUT/study.log
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
timeout 120 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-230 $OUT/s/report.txt | head -16
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases_s.txt 2>&1
grep -E "==|startup  |  read|plan  |upload|probe|connect|partition|distribute|total  " $OUT/phases_s.txt | head -120
rm -f $OUT/s/*.h5
date

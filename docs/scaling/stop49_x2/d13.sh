#!/bin/bash
# session 49, call 3 (x2): is the 2-rank split's time the fresh VM's first touch of guest memory? probe before/after touching 48 GB, then SpMV 160^3 at 1/2
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d13.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
free -g | head -2
timeout 60 $M -n 2 python3 .device/split_probe.py 160 2>&1 | grep -v compiling
date
S=$(date +%s.%N)
for k in $(seq 16); do python3 -c "import numpy as np; a = np.ones(3 << 27)" & done; wait
echo "touched 48 GB in $(echo "$(date +%s.%N) - $S" | bc) s"
free -g | head -2
timeout 60 $M -n 2 python3 .device/split_probe.py 160 2>&1 | grep -v compiling
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s2.log 2>&1
timeout 120 $D --timeout 50 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/s1.log 2>&1
hisparse report --setup $OUT/s | cut -c1-230
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|plan_|read  "
rm -f $OUT/s/*.h5
date

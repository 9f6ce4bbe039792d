#!/bin/bash
# session 51, call 1 (x2): the whole GPU suite on stop 50's untested commits; verified runs;
# Cholesky saved-ordering series at 1/2 with per-rank prepare steps; SpMV 160^3 at 1/2 phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d25.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 330 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests 2>&1 | grep -v Warn | tail -6
date
mkdir -p $OUT/o
for m in lap120 grid2000; do
  timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set operation.params.ordering_file=$OUT/o/$m.h5 2>&1 | grep -E "ok|FAIL|rror" | cut -c1-220
done
timeout 40 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -1 | cut -c1-220
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 100 $D --timeout 45 --id chol_grid2000_saved --set operation.params.ordering_file=$OUT/o/grid2000.h5 inputs/bench_cholesky_grid2000_multigpu.yaml > $OUT/c_grid.log 2>&1
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s1.log 2>&1
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-220 $OUT/s/report.txt | head -8
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -v "^    [a-z_]*plan_[a-z_]*count" | head -120
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

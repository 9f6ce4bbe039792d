#!/bin/bash
# session 50, call 4 (x2): rank 0's entries grouped by one compiled pass, the held-column map in
# each rank's plan and engine: the GPU tests of Cholesky, verified 2-rank runs, and the
# saved-ordering series at 1/2 GPUs (compare with d20.sh, d21.sh, d22.sh)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d23.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky_subtree.py tests/test_cholesky.py 2>&1 | grep -v Warn | tail -4
date
mkdir -p $OUT/o
for m in lap120 grid2000; do
  timeout 100 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set operation.params.ordering_file=$OUT/o/$m.h5 2>&1 | grep -E "ok|FAIL|rror" | cut -c1-220
done
date
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
for m in lap120 grid2000; do
  timeout 100 $D --timeout 45 --id chol_${m}_saved --set operation.params.ordering_file=$OUT/o/$m.h5 inputs/bench_cholesky_${m}_multigpu.yaml > $OUT/c_$m.log 2>&1
done
date
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -8
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -E "==|chol_setup|setup  |symbolic_|analysis_seconds|startup_"
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

#!/bin/bash
# Stop 56, call 1 (2xH200): the mend's GPU tests; CP-ALS 20M at 1/2 ranks with graphs (iteration
# seconds) and without (per-mode phases by events); NCCL's pieces of the per-mode exchange.
cd "$(dirname "$0")/../../.."
S=docs/scaling/stop56_x2
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py > $OUT/suite.log 2>&1; tail -3 $OUT/suite.log
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5"
for n in 1 2; do
  $MP -n $n hisparse run $C --set output.dir=$OUT/cp > $OUT/cp_g$n.log 2>&1
  $MP -n $n hisparse run $C --set gpu.graphs=false --set output.dir=$OUT/cpng > $OUT/cp_ng$n.log 2>&1
done
python3 $S/phases_gpu.py $OUT/cp/*.h5 $OUT/cpng/*.h5
$MP -n 2 python3 $S/nccl_probe.py 2>&1 | grep -v "^$"

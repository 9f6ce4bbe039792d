#!/bin/bash
# Stop 56, call 5 (2xH200): solve_rows with tiles of 4096 doubles (15 warps add up the partials).
# The kernel alone; CP-ALS 20M at 1/2 ranks; the CP-ALS GPU tests; memcheck/racecheck.
cd "$(dirname "$0")/../../.."
S=docs/scaling/stop56_x2
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
python3 $S/solve_probe.py 2>&1 | grep regs
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5"
for n in 1 2; do $MP -n $n hisparse run $C --set output.dir=$OUT/cp$n > $OUT/cp$n.log 2>&1; tail -1 $OUT/cp$n.log; done
python3 $S/phases_gpu.py $OUT/cp1/*.h5 $OUT/cp2/*.h5
python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cpals.py tests/test_cpals_ranks.py > $OUT/suite.log 2>&1; tail -3 $OUT/suite.log
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=1 --set run.warmup=0 --set operation.params.max_iters=2 --set input.generate.nnz=200000 --set gpu.graphs=false --set verify.enabled=false"
for spec in "16 memcheck" "16 racecheck" "32 memcheck" "70 memcheck"; do
  set -- $spec
  compute-sanitizer --tool $2 --kernel-regex kns=solve_rows hisparse run $SMALL --set operation.params.rank=$1 \
    --set output.dir=$OUT/san > $OUT/san_$2_$1.log 2>&1
  echo "rank $1 $2: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$2_$1.log | tail -1) $(grep -c 'hisparse: results written' $OUT/san_$2_$1.log) run"
done

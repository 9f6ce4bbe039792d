#!/bin/bash
# Stop 56, call 3 (2xH200): solve_rows by register tiles and a warp-parallel last block. The
# CP-ALS GPU tests; memcheck and racecheck of solve_rows (ranks 16, 5 and 70); its durations
# (Nsight Compute); CP-ALS 20M at 1/2 ranks (per repeat, iterations).
cd "$(dirname "$0")/../../.."
S=docs/scaling/stop56_x2
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cpals.py tests/test_cpals_ranks.py \
  tests/test_cpals_input.py tests/test_cpals_progress.py > $OUT/suite.log 2>&1; tail -3 $OUT/suite.log
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=1 --set run.warmup=0 --set operation.params.max_iters=2 --set input.generate.nnz=200000 --set gpu.graphs=false --set verify.enabled=false"
for r in 16 5 70; do
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --kernel-regex kns=solve_rows hisparse run $SMALL --set operation.params.rank=$r \
      --set output.dir=$OUT/san > $OUT/san_${tool}_$r.log 2>&1
    echo "rank $r $tool: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_${tool}_$r.log | tail -1)"
  done
done
ncu --clock-control none --kernel-name solve_rows --launch-skip 30 --launch-count 6 --metrics gpu__time_duration.sum \
  --csv --log-file $OUT/ncu_solve.csv hisparse run inputs/bench_cpals_nell2_20m.yaml --set 'peers=[]' --set run.repeats=1 \
  --set gpu.graphs=false --set output.dir=$OUT/ncu > /dev/null 2>&1
grep solve_rows $OUT/ncu_solve.csv | awk -F'","' '{print "  solve_rows", $(NF)}' | tr -d '"'
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5"
for n in 1 2; do $MP -n $n hisparse run $C --set output.dir=$OUT/cp$n > $OUT/cp$n.log 2>&1; tail -1 $OUT/cp$n.log; done
python3 $S/phases_gpu.py $OUT/cp1/*.h5 $OUT/cp2/*.h5

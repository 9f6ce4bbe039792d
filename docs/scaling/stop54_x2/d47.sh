#!/bin/bash
# session 54, call 3 (x2): the distributed Cholesky solve's subtrees by the dataflow kernels
# (solve_schedule flow, now the default under strategy subtree) -- the Cholesky GPU tests,
# memcheck at 2 ranks, then flow against levels at 2 GPUs (saved orderings, alternated) with
# one rank's flow solve beside them
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d47.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 240 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky_subtree.py tests/test_cholesky.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
for x in flow levels; do
  timeout 120 $M -n 2 compute-sanitizer --tool memcheck --error-exitcode 9 hisparse run inputs/bench_cholesky_lap120_multigpu.yaml --set 'input.generate.dims=[16,15,14]' --set operation.params.top_piece_columns=24 --set operation.params.solve_schedule=$x --set operation.params.refinement=1 --set run.repeats=1 --set 'peers=[]' --set output.dir=/tmp/mc --quiet > $OUT/mc_$x.log 2>&1
  echo "memcheck 2 ranks $x: rc $? $(grep -c 'ERROR SUMMARY: 0 errors' $OUT/mc_$x.log) clean summaries; $(grep -E ' ok | FAIL' $OUT/mc_$x.log | head -1 | cut -c1-160)"
done
date
V="--set peers=[] --set run.repeats=5 --quiet"
for m in grid2000 lap120; do
  o=$OUT/ord_$m.h5
  d=$OUT/one/$m; mkdir -p $d
  timeout 90 $M -n 1 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d --set operation.params.ordering_file=$o > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "1 rank flow: $(python3 .device/cholsum.py $d/*.h5)"; python3 .device/phases.py $d/*.h5 | grep -E "  (numeric|solve|refine|d2h|h2d|total)  "; rm -f $d/*.h5
  for x in flow levels flow levels; do
    d=$OUT/ab/${m}_$x; mkdir -p $d
    timeout 90 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d --set operation.params.ordering_file=$o --set operation.params.solve_schedule=$x > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "2 ranks $x: $(python3 .device/cholsum.py $d/*.h5)"; python3 .device/phases.py $d/*.h5 | grep -E "  (numeric|solve|refine|d2h|total)  "; rm -f $d/*.h5
  done
done
date

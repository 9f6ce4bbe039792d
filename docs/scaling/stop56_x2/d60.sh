#!/bin/bash
# Stop 56, call 2 (2xH200): what solve_rows spends (Nsight Compute sections, caches as in a run);
# where a rank's start-up goes (import times, 1 and 2 processes); SpTV 77M at 1/2 ranks again;
# Cholesky grid 2000^2's analysis breakdown at 1 rank.
cd "$(dirname "$0")/../../.."
S=docs/scaling/stop56_x2
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
ncu --clock-control none --cache-control none --kernel-name solve_rows --launch-skip 30 --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section SchedulerStats \
  hisparse run inputs/bench_cpals_nell2_20m.yaml --set 'peers=[]' --set run.repeats=1 \
  --set gpu.graphs=false --set output.dir=$OUT/ncu > $OUT/ncu_solve.txt 2>&1
grep -E "solve_rows|Duration|Elapsed Cycles|Registers|Achieved Occupancy|Block Size|Grid Size|Stall|Warp Cycles Per Issued|Memory Throughput|Compute \(SM\)|L1/TEX Hit|L2 Hit|Theoretical Occ|Shared Memory Config" $OUT/ncu_solve.txt | head -80
echo "== start-up"
( time python3 -c pass ) 2>&1 | grep real
( time python3 -c "import hisparse.cli" ) 2>&1 | grep real
python3 -X importtime -c "import hisparse.cli" 2> $OUT/importtime1.txt
sort -t'|' -k2 -n $OUT/importtime1.txt | tail -8
( time $MP -n 1 python3 -c pass ) 2>&1 | grep real
( time $MP -n 2 python3 -c pass ) 2>&1 | grep real
( time $MP -n 2 python3 -c "import hisparse.cli" ) 2>&1 | grep real
echo "== SpTV"
C="inputs/bench_sptv_nell2_multigpu.yaml --set peers=[] --set run.repeats=5 --set verify.enabled=false"
$MP -n 1 hisparse run $C --set output.dir=$OUT/sptv > /dev/null 2>&1   # primes the compiles
for n in 1 2; do $MP -n $n hisparse run $C --set output.dir=$OUT/sptv$n > $OUT/sptv$n.log 2>&1; tail -1 $OUT/sptv$n.log; done
python3 $S/phases_gpu.py $OUT/sptv1/*.h5 $OUT/sptv2/*.h5
python3 docs/scaling/stop55_x2/phases.py $OUT/sptv1/*.h5 $OUT/sptv2/*.h5 | grep -v "^    "
echo "== Cholesky grid 2000^2 analysis, 1 rank"
$MP -n 1 hisparse run inputs/bench_cholesky_grid2000_multigpu.yaml --set 'peers=[]' --set run.repeats=1 \
  --set output.dir=$OUT/chol > $OUT/chol.log 2>&1; tail -1 $OUT/chol.log
python3 - $OUT/chol/*.h5 <<'PY'
import sys
from hisparse.io import read_results
a = read_results(sys.argv[1])["attrs"]
for k in sorted(a):
    if k.startswith("chol_ordering") or k in ("chol_analysis_seconds", "chol_symbolic_seconds", "time_to_solution_seconds", "setup_seconds"):
        print(f"  {k:48s} {a[k]}")
PY

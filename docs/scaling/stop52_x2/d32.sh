#!/bin/bash
# session 52, call 2 (x2): the tensor generator's per-process cost with a warm CuPy cache, and a
# cProfile of SpTV's set-up at 1 and 2 ranks (primed)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d32.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
python3 docs/scaling/stop52_x2/probe52.py > $OUT/probe52.log 2>&1; grep -E "^(cupy|sptv77m half0 )" $OUT/probe52.log
python3 docs/scaling/stop52_x2/probe53.py 2>&1 | cut -c1-170
C="inputs/bench_sptv_nell2_multigpu.yaml --set peers=[] --set run.repeats=5 --set verify.enabled=false --set output.dir=$OUT/v"
timeout 60 $M -n 1 hisparse run $C > /dev/null 2>&1   # prime
timeout 60 $M -n 2 hisparse run $C > /dev/null 2>&1
timeout 60 $M -n 1 python3 .device/prof_run.py run $C 2>&1 | grep -E "=====|/app/|cupy|built-in" | head -50
timeout 60 $M -n 2 python3 .device/prof_run.py run $C 2>&1 | grep -E "=====|/app/|cupy|built-in" | head -100
python3 .device/phases.py $OUT/v/*.h5 > $OUT/phases.txt 2>&1
rm -f $OUT/v/*.h5
date

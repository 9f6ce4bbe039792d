#!/bin/bash
# session 53, call 8 (x2): where the file read of 27-pt 160^3 goes (probe58 at 1 and 2 processes),
# and rank 0's main thread in a 1-rank run's read (cProfile)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d43.log) 2>&1
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
timeout 60 python3 .device/probe58.py /tmp/p160.h5
timeout 60 mpirun --bind-to none -n 2 python3 .device/probe58.py /tmp/p160.h5
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set run.repeats=1 --set verify.enabled=false --set input.path=/tmp/p160.h5 --quiet"
timeout 60 hisparse run $S --set output.dir=$OUT/w > /dev/null 2>&1
timeout 60 python3 .device/prof_read.py run $S --set output.dir=$OUT/w 2>&1 | head -45
python3 .device/phases.py $OUT/w/*.h5 | grep -E "==|read  |plan  |upload  "
rm -rf $OUT/w
date

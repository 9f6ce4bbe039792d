#!/bin/bash
# Stop 59, call 3 (2xH200): where R-MAT 23's set-up goes. (1) rmat_read_probe.py: the read's
# steps on one GPU (rank 0's part at 1 and 2 ranks). (2) The SpMV run at 2 and 1 GPUs, this
# tree, OMPI_MCA_pml=ob1, each twice after a compiling run; (3) a cProfile of the 2-rank run's
# host functions (prof_run.py of stop 58).
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop59_x2
date
python3 $P/rmat_read_probe.py 23 1
python3 $P/rmat_read_probe.py 23 2
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
for n in 2 2 1 2 1; do
  d=$OUT/rmat/r$n; mkdir -p $d; rm -f $d/*.h5
  timeout 120 $MP -n $n hisparse run $R $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== ranks $n"; python3 docs/scaling/stop55_x2/phases.py $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|collect)  |plan_|startup_"
done
date
PROF_MATCH='distmatrix|ops/spmv|parallel|layout|arrays|threads|formats|gpu/_raw' PROF_LINES=40 timeout 120 $MP -n 2 python3 docs/scaling/stop58_x2/prof_run.py run $R $S --set output.dir=$OUT/prof 2>&1 | grep "rank" | head -90
date

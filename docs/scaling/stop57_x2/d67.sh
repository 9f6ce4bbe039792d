#!/bin/bash
# Stop 57, call 4 (2xH200): where the read of R-MAT 23's rows made on the GPU goes
# (rows_probe.py, one process per GPU), and R-MAT 23 SpMV at 2 and 1 GPUs with the degree
# renumbering's compiled pass loaded while the input is read (each run twice: the first compiles).
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
timeout 120 $MP -n 1 python3 docs/scaling/stop57_x2/rows_probe.py 23
timeout 120 $MP -n 2 python3 docs/scaling/stop57_x2/rows_probe.py 23
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks
  local label=$1 n=$2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run $R $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds"
  rm -f $d/*.h5
}
for n in 2 1; do one r${n}a $n; one r${n}b $n; done

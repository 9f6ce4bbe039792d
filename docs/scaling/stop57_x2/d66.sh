#!/bin/bash
# Stop 57, call 3 (2xH200): R-MAT 23 SpMV, the rows made on every GPU against the tree before
# (48ce438, /tmp/old), each run twice in a row (the first of each compiles what the second
# reuses: Numba's caches are per tree), at 2 and 1 GPUs: phases and plan steps.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks tree
  local label=$1 n=$2 tree=$3
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 120 $MP -x PYTHONPATH -n $n python3 -m hisparse run $R $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds"
  rm -f $d/*.h5
}
for n in 2 1; do
  for k in a b; do one new_r${n}$k $n ""; one old_r${n}$k $n /tmp/old; done
done

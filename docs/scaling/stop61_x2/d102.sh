#!/bin/bash
# Stop 61, call 5 (2xH200, lent at the stop's end): SpMV R-MAT 23 at 1 and 2 GPUs on this stop's
# code, and at 2 GPUs against the tree before its SpMV change (old.tar.gz = 8aab62d), alternated,
# each configuration run once first to compile. One rank per GPU, NCCL, 5 repeats.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d102.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date; nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 100 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total|collect)  |plan_(split|exchange|reorder)_"
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
PRE=""; timeout 100 $MP -n 2 python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1
PRE="$OLD"; timeout 100 $MP $OLD -n 2 python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1
timeout 100 $MP -n 1 python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1
rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one r1_new_$k 1 $R
  PRE=""; one r2_new_$k 2 $R
  PRE="$OLD"; one r2_old_$k 2 $R
done
date

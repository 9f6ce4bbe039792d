#!/bin/bash
# session 48, call 5 (x2): glibc malloc keeping freed memory (MALLOC_MMAP_MAX_=0, huge trim threshold) vs default, R-MAT 23 and SpMV 160^3 at 1/2 ranks
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d9.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
S="--set peers=[] --set verify.enabled=false --set run.repeats=5"
H="-x MALLOC_MMAP_MAX_=0 -x MALLOC_TRIM_THRESHOLD_=1000000000000"
date
for n in 1 2; do
$M -n $n hisparse run inputs/bench_spmv_rmat.yaml $S --set input.generate.scale=23 --set run.repeats=1 --set output.dir=/tmp/p > /dev/null 2>&1
$M -n $n hisparse run inputs/bench_spmv_scaling.yaml $S --set run.repeats=1 --set output.dir=/tmp/p > /dev/null 2>&1
done
date
for k in a b; do
for heap in default keep; do
  X=""; [ $heap = keep ] && X="$H"
  for n in 1 2; do
    timeout 40 $M -n $n $X hisparse run inputs/bench_spmv_rmat.yaml $S --set input.generate.scale=23 --set run.name=rmat_$heap --set output.dir=$OUT/r_$heap > /dev/null 2>&1
    timeout 30 $M -n $n $X hisparse run inputs/bench_spmv_scaling.yaml $S --set run.name=st_$heap --set output.dir=$OUT/s_$heap > /dev/null 2>&1
  done
done
[ $k = a ] && date
done
date
for d in r_default r_keep s_default s_keep; do echo "### $d"; hisparse report --setup $OUT/$d | cut -c1-170; done
python3 .device/phases.py $OUT/*/*.h5 2>&1 | grep -E "==|plan_split|plan_reorder|peak_host"
rm -f $OUT/*/*.h5
date

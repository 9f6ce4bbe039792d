#!/bin/bash
# Stop 61, call 7 (2xH200): Cholesky 7-pt 120^3 at 1 and 2 GPUs and SpTV's per-repeat phases, on
# this stop's code (compiled first at each rank count, then timed once).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d104.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
for c in "chol120 inputs/bench_cholesky_lap120_multigpu.yaml" "sptv inputs/bench_sptv_nell2_multigpu.yaml"; do
  set -- $c; label=$1; shift
  for n in 1 2; do
    [ $label = chol120 ] && { timeout 60 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$OUT/r_c > /dev/null 2>&1; rm -rf $OUT/r_c; }
    d=$OUT/r_${label}_$n; mkdir -p $d
    timeout 60 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
    echo "== ${label} r$n"; python3 $P $d/*.h5 | grep -E "tts|  (startup|analysis|numeric|total|sptv|multiply|ttv)|repeat"
    rm -f $d/*.h5
  done
done
date

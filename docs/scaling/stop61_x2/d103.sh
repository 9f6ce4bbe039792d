#!/bin/bash
# Stop 61, call 6 (2xH200): the other strong series at 1 and 2 GPUs on this stop's code, each
# configuration run once first at each rank count to compile, then timed once. One rank per GPU,
# NCCL, 5 repeats, peers and verification off.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d103.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
for c in "spmv160 inputs/bench_spmv_scaling.yaml" \
         "spgemm128 inputs/bench_spgemm_poisson27_128.yaml" \
         "spgemm_rmat18 inputs/bench_spgemm_rmat18.yaml" \
         "sptv inputs/bench_sptv_nell2_multigpu.yaml" \
         "cpals inputs/bench_cpals_nell2_20m.yaml"; do
  set -- $c; label=$1; shift
  for n in 1 2; do
    timeout 60 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$OUT/r_c > /dev/null 2>&1; rm -rf $OUT/r_c
    d=$OUT/r_${label}_$n; mkdir -p $d
    timeout 60 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
    echo "== ${label} r$n"; python3 $P $d/*.h5 | grep -E "tts|  (startup|total)  "
    rm -f $d/*.h5
  done
done
date

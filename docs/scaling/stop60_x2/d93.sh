#!/bin/bash
# Stop 60, call 3 (2xH200): the set-up at 4 ranks, two ranks a GPU (no 4-GPU machine lent):
# every strong series once to compile, then at 2 ranks (one a GPU) and 4 (two a GPU) in the
# same call. Per-repeat times at 4 share a GPU and say nothing of 4 GPUs; the set-up's host
# steps (read, plan, partition, distribute, analysis) are each rank's own work.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d93.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -vE "^    (startup_|chol_(setup|prepare|exchange|solve|top|subtree))|csr5|plan_device"
  rm -f $d/*.h5
}
for c in "spmv160 inputs/bench_spmv_scaling.yaml" \
         "rmat23 inputs/bench_spmv_rmat.yaml --set input.generate.scale=23" \
         "spgemm128 inputs/bench_spgemm_poisson27_128.yaml" \
         "spgemm_rmat18 inputs/bench_spgemm_rmat18.yaml" \
         "sptv inputs/bench_sptv_nell2_multigpu.yaml" \
         "cpals inputs/bench_cpals_nell2_20m.yaml" \
         "chol120 inputs/bench_cholesky_lap120_multigpu.yaml"; do
  set -- $c; label=$1; shift
  timeout 200 $MP -n 2 python3 -m hisparse run "$@" $S --set output.dir=$OUT/r_c > /dev/null 2>&1; rm -rf $OUT/r_c
  one ${label}_r2 2 "$@"
  one ${label}_r4 4 "$@"
done
date

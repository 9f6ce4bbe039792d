#!/bin/bash
# session 55, call 2 (x2): SpMV's ghost block in CSR-vector against CSR5 at 2 ranks (27-pt 160^3,
# R-MAT 20 and 23), alternated; cProfile of R-MAT 23's read and plan on both ranks
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d53.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config args...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 90 $M -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 .device/phases.py $d/*.h5 | grep -E "  (read|plan|total)  "; rm -f $d/*.h5
}
P=inputs/bench_spmv_scaling.yaml
one s160_r1 1 $P --set verify.enabled=false
for k in 1 2; do
  one s160_csr5_$k 2 $P --set operation.params.ghost_format=csr5 $([ $k = 2 ] && echo --set verify.enabled=false)
  one s160_csr_$k 2 $P --set operation.params.ghost_format=csr $([ $k = 2 ] && echo --set verify.enabled=false)
done
date
R=inputs/bench_spmv_rmat.yaml
for sc in 20 23; do
  for k in 1 2; do
    one rmat${sc}_csr5_$k 2 $R --set input.generate.scale=$sc --set operation.params.ghost_format=csr5 $([ $k = 2 ] && echo --set verify.enabled=false)
    one rmat${sc}_csr_$k 2 $R --set input.generate.scale=$sc --set operation.params.ghost_format=csr $([ $k = 2 ] && echo --set verify.enabled=false)
  done
done
date
timeout 120 $M -n 2 python3 .device/prof_rmat.py run $R --set input.generate.scale=23 $S --set verify.enabled=false --set output.dir=$OUT/p 2>&1 | grep "rank" | head -100
date

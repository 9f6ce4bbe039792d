#!/bin/bash
# Stop 60, call 2 (2xH200): the GPU split's test after its fix (the repeated-values cases), the
# GPU suites of SpMV; R-MAT 23 at 2 GPUs with the exchange's steps apart; a cProfile of CP-ALS
# 20M at 2 GPUs (read and distribute) and of Cholesky 120^3's distribution at 2.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d92.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
echo "== GPU tests"
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_spmv_distributed.py tests/test_spmv.py tests/test_spmv_checkerboard.py > $OUT/suite_d92.log 2>&1; tail -3 $OUT/suite_d92.log
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|collect|partition|distribute|connect)  |plan_|peak_host_bytes "
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one compile 2 $R
one r2a 2 $R
one r2b 2 $R
C="inputs/bench_cpals_nell2_20m.yaml"
one cp_compile 2 $C
one cp2a 2 $C
one cp1a 1 $C
echo "== cProfile CP-ALS 2 GPUs"
PROF_MATCH="hisparse|cupy|nccl" PROF_LINES=40 timeout 150 $MP -n 2 python3 docs/scaling/stop58_x2/prof_run.py run $C $S --set output.dir=$OUT/r_prof 2>&1 | grep "rank" | head -90
rm -rf $OUT/r_prof
date

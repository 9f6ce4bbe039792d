#!/bin/bash
# Stop 58, call 3 (2xH200): the renumbering's steps on the GPU timed (plan_reorder_device_*);
# parallel.connect_early (NCCL's pair connections made on the set-up thread while the input is
# read and planned) on R-MAT 23 and on the 27-point 160^3 at 2 GPUs, against without, each run
# twice (the second counts), and both at one GPU.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
timeout 100 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py -k "renumber or reorder or rmat or steps" > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
C="inputs/bench_spmv_scaling.yaml --set verify.enabled=false"
E="--set parallel.connect_early=true"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|connect|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds|halo_gbps"
  rm -f $d/*.h5
}
for k in a b; do
  one rmat_r2$k 2 $R; one rmat_r2e$k 2 $R $E; one rmat_r1$k 1 $R
done
for k in a b; do
  one s160_r2$k 2 $C; one s160_r2e$k 2 $C $E; one s160_r1$k 1 $C
done
date

#!/bin/bash
# Stop 58, call 4 (2xH200): host arrays to CuPy through page-locked pieces filled on threads
# (host_to_device: the renumbering's operands) and parallel.connect_early: auto (on for SpMV):
# the GPU tests of the GPU layer's copies and of the distributed SpMV; the upload probe; R-MAT
# 23 and the 27-point 160^3 at 2 and 1 GPUs, each twice (the second counts); R-MAT 21 and 160^3
# verified at 2 GPUs.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_gpu_layer.py tests/test_spmv_distributed.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 120 python3 docs/scaling/stop58_x2/upload_probe.py 2>&1 | tail -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
C="inputs/bench_spmv_scaling.yaml --set verify.enabled=false"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|connect|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds|halo_gbps"
  python3 -c "import sys,h5py; a=h5py.File(sys.argv[1]).attrs; print('   verify', a.get('verify_passed'), a.get('verify_max_rel_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
for k in a b; do one rmat_r2$k 2 $R; one rmat_r1$k 1 $R; done
for k in a b; do one s160_r2$k 2 $C; one s160_r1$k 1 $C; done
one verify21_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify160_r2 2 inputs/bench_spmv_scaling.yaml --set verify.enabled=true --set run.repeats=2
date

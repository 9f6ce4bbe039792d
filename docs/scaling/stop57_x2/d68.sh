#!/bin/bash
# Stop 57, call 5 (2xH200): the columns downloaded through page-locked buffers; the GPU tests of
# the generators, the row input and SpMV; R-MAT 23 SpMV at 2 and 1 GPUs (each twice: the first
# compiles), R-MAT 21 verified at 2 GPUs.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py tests/test_spmv.py tests/test_spmv_distributed.py tests/test_spmv_csr5.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_status'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
for n in 2 1; do one r${n}a $n $R; one r${n}b $n $R; done
one verify21_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2
date

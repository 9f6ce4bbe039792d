#!/bin/bash
# Stop 57, call 6 (2xH200): the rows made on the GPU come in the run's index dtype (int32
# columns copied, no cast on the host; CuPy's get again: d68's page-locked pieces were no
# faster); the generator and row-input GPU tests; R-MAT 23 SpMV at 2 and 1 GPUs (each twice: the
# first compiles), the checkerboard at 2; R-MAT 21 verified at 2 (rows, checkerboard).
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_max_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
for n in 2 1; do one r${n}a $n $R; one r${n}b $n $R; done
one cb_r2 2 $R --set partition.strategy=checkerboard
one verify21_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify21_cb_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2 --set partition.strategy=checkerboard

#!/bin/bash
# session 55, call 7 (x2): R-MAT edges made on the GPUs: the new GPU tests, memcheck of the
# kernel, R-MAT 21 at 2 GPUs verified, R-MAT 23 at 1 and 2 GPUs (time to solution, read)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d58.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 60 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)|Error" $OUT/suite.log | head -20
date
timeout 45 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -o addopts="" -p no:cacheprovider tests/test_generators.py -k "device_are_the_hosts and 14" > $OUT/memcheck.log 2>&1
grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | head -5
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config args...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 60 $M -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 .device/phases.py $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total)  "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_status'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}

R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one rmat23_r1 1 $R
one rmat23_r2 2 $R
date

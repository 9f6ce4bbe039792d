#!/bin/bash
# Stop 57, call 1 (2xH200): R-MAT's whole unit rows made on every GPU (RmatRowsOnDevice): the
# generator and row-input GPU tests, memcheck of the new kernels, R-MAT 23 SpMV at 1 / 2 GPUs
# against the tree before (48ce438, unpacked to /tmp/old), R-MAT 21 verified.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
PYTHONPATH=/tmp/old:$PYTHONPATH python3 -c "import hisparse; print('old tree:', hisparse.__file__)"
timeout 150 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 100 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -o addopts="" -p no:cacheprovider tests/test_generators.py -k "unit_rows_on_device and 13" > $OUT/memcheck.log 2>&1
grep -E "ERROR SUMMARY|passed|failed" $OUT/memcheck.log | head -3
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks tree config args...
  local label=$1 n=$2 tree=$3; shift 3
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 120 $MP -x PYTHONPATH -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total)  "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_status'), a.get('verify_error'))" $d/*.h5 2>/dev/null
}
W="inputs/bench_spmv_rmat.yaml --set input.generate.scale=18"
one warm_new 1 "" $W
one warm_old 1 /tmp/old $W
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
for n in 1 2; do one new_rmat23_r$n $n "" $R; one old_rmat23_r$n $n /tmp/old $R; done
one verify_rmat21_r2 2 "" inputs/bench_spmv_rmat.yaml --set run.repeats=2
date

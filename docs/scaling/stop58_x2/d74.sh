#!/bin/bash
# Stop 58, call 1 (2xH200): the degree renumbering's row moves on the GPU (RowsOnDevice): its GPU
# tests and memcheck; R-MAT 23 SpMV at 2 and 1 GPUs against the tree before (2986ba4, /tmp/old),
# each twice in a row (the first compiles); R-MAT 21 verified at 1 and 2 GPUs; a profile of the
# one-GPU run's read and plan.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
date
timeout 240 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv.py tests/test_spmv_distributed.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 120 compute-sanitizer --tool memcheck python3 -m pytest -m gpu -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py -k "renumber or reorder_local" > $OUT/memcheck.log 2>&1
tail -3 $OUT/memcheck.log | cut -c1-200
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks tree config...
  local label=$1 n=$2 tree=$3; shift 3
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 120 $MP -x PYTHONPATH -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total)  |plan_|compile_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_status'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
for n in 2 1; do
  for k in a b; do one new_r${n}$k $n "" $R; one old_r${n}$k $n /tmp/old $R; done
done
one verify21_r2 2 "" inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify21_r1 1 "" inputs/bench_spmv_rmat.yaml --set run.repeats=2
date
PROF_MATCH="(generators|layout|gpu/|ops/spmv|formats|distmatrix|cupy/_core|cupy/cuda|driver)" PROF_LINES=40 \
  timeout 120 $MP -n 1 python3 docs/scaling/stop58_x2/prof_run.py run $R $S --set output.dir=$OUT/p > $OUT/prof.log 2>&1
grep "^\[rank" $OUT/prof.log | head -42
rm -f $OUT/p/*.h5
date

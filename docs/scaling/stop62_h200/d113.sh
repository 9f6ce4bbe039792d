#!/bin/bash
# Stop 62, call 9 (one H200): the Cholesky GPU suites after cholesky/gpu.py's host-side chunk
# schedule moved unchanged (AST-compared) into cholesky/schedule.py; a 7-point 60^3 run
# verified at 1 and 2 ranks sharing the GPU.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d113.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky.py \
  tests/test_cholesky_subtree.py tests/test_cholesky_geometric.py > $OUT/suite_d113.log 2>&1; tail -2 $OUT/suite_d113.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d113.log | head
for n in 1 2; do
  timeout 120 $MP -n $n python3 -m hisparse run inputs/bench_cholesky_lap60.yaml --set peers=[] --set run.repeats=1 --set verify.enabled=true --set output.dir=$OUT/v$n > $OUT/v$n.log 2>&1
  python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print('ranks', sys.argv[2], 'verify', a.get('verify_passed'), a.get('verify_error'))" $OUT/v$n $n || tail -5 $OUT/v$n.log
  rm -rf $OUT/v$n
done
date

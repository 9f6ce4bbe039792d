#!/bin/bash
# Stop 59, call 8 (2xH200): SpGEMM's B = A on several ranks put together from the ranks' parts
# where A is slow to make again (R-MAT) or a file. GPU tests of SpGEMM; R-MAT 18 at 1 and 2
# GPUs, each twice after a compiling run (OMPI_MCA_pml=ob1).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d89.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spgemm.py \
  tests/test_spgemm_input.py tests/test_spgemm_partition.py > $OUT/suite_d89.log 2>&1
tail -2 $OUT/suite_d89.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite_d89.log | head -20
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
for n in 1 1 2 1 2; do
  d=$OUT/g/r$n; mkdir -p $d
  timeout 100 $MP -n $n hisparse run inputs/bench_spgemm_rmat18.yaml $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
done
rm -f "$(ls -tr $OUT/g/r1/*.h5 | head -1)"
python3 docs/scaling/stop55_x2/phases.py $(ls -tr $OUT/g/r1/*.h5 $OUT/g/r2/*.h5) | grep -E "==|  (startup|read|distribute|upload|prepare|numeric|total)  "
d=$OUT/v; mkdir -p $d
timeout 100 $MP -n 2 hisparse run inputs/bench_spgemm_rmat18.yaml --set peers=[] --set run.repeats=1 --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('verified at 2 GPUs:', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5
rm -rf $OUT/g $OUT/v
date

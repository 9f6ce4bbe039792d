#!/bin/bash
# Stop 59, call 4 (2xH200): R-MAT's unit values as one value repeated (no 1 GB of ones on the
# host; the split moves the columns alone). GPU tests of the split, the renumbering, the row
# input and the options (repeated values included); R-MAT 21 verified at 1 and 2 GPUs; R-MAT
# 23 at 2 and 1 GPUs, this tree against fc7ddd8 (/tmp/old), each twice after a compiling run,
# both under OMPI_MCA_pml=ob1. Everything goes to $OUT/d85.log as well.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d85.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
date
timeout 330 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py \
  tests/test_parallel_input.py tests/test_gpu_layer.py tests/test_generators.py tests/test_arrays.py > $OUT/suite_d85.log 2>&1
tail -2 $OUT/suite_d85.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite_d85.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks tree config...
  local label=$1 n=$2 tree=$3; shift 3
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 150 $MP -x PYTHONPATH -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|collect)  |plan_split|plan_reorder_seconds|plan_exchange|peak_host_bytes "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_status'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
one verify21_r1 1 "" inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify21_r2 2 "" inputs/bench_spmv_rmat.yaml --set run.repeats=2
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one compile_new 1 "" $R
one compile_old 1 /tmp/old $R
for k in a b; do
  for n in 2 1; do one new_r$n$k $n "" $R; one old_r$n$k $n /tmp/old $R; done
done
date

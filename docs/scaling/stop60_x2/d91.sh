#!/bin/bash
# Stop 60, call 1 (2xH200): SpMV's block split on the GPU (RowsOnDevice.split). The split's and
# the renumbering's GPU tests, memcheck of the new kernels, R-MAT 21 verified at 1 and 2 GPUs,
# R-MAT 23 at 1 and 2 GPUs twice after a compiling run (OMPI_MCA_pml=ob1), the same against
# the previous tree (old.tar.gz, abfc3fe) in the same call.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d91.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== GPU tests"
timeout 240 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_spmv_distributed.py tests/test_gpu_layer.py > $OUT/suite_d91.log 2>&1; tail -5 $OUT/suite_d91.log
echo "== memcheck of the split's kernels"
timeout 200 compute-sanitizer --tool memcheck --leak-check no python3 -m pytest -q -o addopts="" \
  -p no:cacheprovider tests/test_spmv_distributed.py -k "gpus_split and power_law" 2>&1 | tail -6
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|collect)  |plan_|peak_host_bytes "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
PRE=""
one verify21_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify21_r1 1 inputs/bench_spmv_rmat.yaml --set run.repeats=2
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one compile 2 $R
for k in a b; do one r2$k 2 $R; one r1$k 1 $R; done
echo "== Numba imported by rank 0 of a 2-GPU R-MAT 23 run:"
timeout 100 $MP -n 2 python3 -c "import sys; from hisparse.cli import main; rc = main(sys.argv[1:]); print('NUMBA', 'numba' in sys.modules); sys.exit(rc)" run $R $S --set output.dir=$OUT/r_numba | grep NUMBA
rm -rf $OUT/r_numba
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
PRE="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
for k in a b; do one old_r2$k 2 $R; done
date

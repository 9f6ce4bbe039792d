#!/bin/bash
# Stop 58, call 5 (2xH200): the degree order on the GPU (RowsOnDevice.degree_order, the row
# pointers summed there), the threaded column counts, arrays.in_module, the permutation's
# operands spelled once: the GPU tests of the SpMV plan, the generators, the row and tensor
# input, the GPU layer, the arrays and SpTV; R-MAT 23 at 2 and 1 GPUs (each twice, the second
# counts); Cholesky 250^3 at 2 GPUs on a machine whose compiles a small run made first, every
# phase printed.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv_distributed.py tests/test_generators.py tests/test_parallel_input.py tests/test_gpu_layer.py tests/test_arrays.py tests/test_sptv.py tests/test_tensor_input.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5
  rm -f $d/*.h5
}
for k in a b; do one rmat_r2$k 2 $R; one rmat_r1$k 1 $R; done
date
one chol_warm 2 inputs/bench_cholesky_lap120_multigpu.yaml --set 'input.generate.dims=[40,40,40]'
one lap250_r2 2 inputs/bench_cholesky_lap250_multigpu.yaml
date

#!/bin/bash
# Stop 58, call 2 (2xH200): fresh host memory first touched on the host's threads (the R-MAT
# read's columns and unit values, the renumbering's copies back): the GPU tests of the
# generators, the row input and the renumbering; R-MAT 23 SpMV at 2 and 1 GPUs against the tree
# before (2986ba4), each twice; Cholesky with ordering auto (the grid's planes): the 7-point
# 120^3 at one GPU twice (the second without compiles) and at two, then 250^3 at two GPUs.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
date
timeout 150 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py tests/test_spmv_distributed.py -k "renumber or reorder or rmat or generat or part" > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one() {  # label ranks tree config...
  local label=$1 n=$2 tree=$3; shift 3
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 240 $MP -x PYTHONPATH -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|analysis|distribute|numeric|solve|refine)  |plan_|compile_seconds"
  python3 -c "
import sys,h5py; a=h5py.File(sys.argv[1]).attrs
print('   ', {k: a.get(k) for k in ('verify_passed','verify_max_rel_error','chol_ordering','chol_factor_nnz','chol_factor_flops','chol_ordering_seconds','chol_symbolic_seconds','chol_logdet') if k in a})" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
for n in 2 1; do
  for k in a b; do one new_r${n}$k $n "" $R; one old_r${n}$k $n /tmp/old $R; done
done
date
L=inputs/bench_cholesky_lap120_multigpu.yaml
one chol_warm 2 "" $L --set 'input.generate.dims=[40,40,40]'
one lap120_r1a 1 "" $L
one lap120_r1b 1 "" $L
one lap120_r2 2 "" $L
date
one lap250_r2 2 "" inputs/bench_cholesky_lap250_multigpu.yaml
date

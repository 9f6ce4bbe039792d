#!/bin/bash
# Stop 57, call 10 (2xH200): ordering auto = the planes of the grid, diagonal ones for the
# 5/7-point stencils (Numba's compiled dissection): the 7-point Laplacian 120^3 at 1 and 2 GPUs
# and the grid 2000^2 at one, verified; a small 3-D run first compiles.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
S="--set peers=[] --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 120 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|analysis|distribute|upload|h2d|numeric|solve|refine|prepare|total)  "
  python3 -c "
import sys,h5py; a=h5py.File(sys.argv[1]).attrs
print('   ', {k: a.get(k) for k in ('verify_passed','verify_max_rel_error','chol_ordering','chol_factor_nnz','chol_factor_flops','chol_ordering_seconds','chol_symbolic_seconds','chol_logdet')})" $d/*.h5
  rm -f $d/*.h5
}
G=inputs/bench_cholesky_grid2000_multigpu.yaml
L=inputs/bench_cholesky_lap120_multigpu.yaml
one warm 2 $L --set 'input.generate.dims=[40,40,40]'
one lap_r1 1 $L
one lap_r2 2 $L
one grid_r1 1 $G

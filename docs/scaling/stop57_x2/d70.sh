#!/bin/bash
# Stop 57, call 7 (2xH200): Cholesky with ordering: geometric (nested dissection of the grid by
# coordinate planes, no METIS) against METIS (auto) on the grid 2000^2 and the Laplacian 120^3,
# at 1 and 2 GPUs, verified (backward error); a small run first compiles the kernels.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
S="--set peers=[] --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|analysis|distribute|upload|h2d|numeric|solve|refine|prepare|total)  "
  python3 -c "
import sys,h5py; a=h5py.File(sys.argv[1]).attrs
print('   ', {k: a.get(k) for k in ('verify_passed','chol_ordering','chol_backward_error','chol_factor_nnz','chol_factor_flops','chol_ordering_seconds','chol_symbolic_seconds','chol_logdet')})" $d/*.h5
  rm -f $d/*.h5
}
G=inputs/bench_cholesky_grid2000_multigpu.yaml
L=inputs/bench_cholesky_lap120_multigpu.yaml
one warm 1 $G --set 'input.generate.dims=[300,300]' --set operation.params.ordering=geometric
for n in 1 2; do
  one grid_geo_r$n $n $G --set operation.params.ordering=geometric
  one lap_geo_r$n $n $L --set operation.params.ordering=geometric
done
one grid_metis_r1 1 $G
one lap_metis_r1 1 $L
one grid_metis_r2 2 $G

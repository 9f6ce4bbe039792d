#!/bin/bash
# Stop 57, call 8 (2xH200): ordering: geometric once compiled (d70's one-rank grid run paid
# Numba's first compiles): grid 2000^2 at one GPU twice; the 27-point Laplacian 120^3, where the
# planes' fill is METIS's, geometric against METIS at one GPU.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
S="--set peers=[] --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|analysis|distribute|upload|h2d|numeric|solve|refine|prepare|total)  "
  python3 -c "
import sys,h5py; a=h5py.File(sys.argv[1]).attrs
print('   ', {k: a.get(k) for k in ('verify_passed','verify_max_rel_error','chol_ordering','chol_factor_nnz','chol_factor_flops','chol_ordering_seconds','chol_symbolic_seconds','chol_logdet')})" $d/*.h5
  rm -f $d/*.h5
}
G=inputs/bench_cholesky_grid2000_multigpu.yaml
L=inputs/bench_cholesky_lap120_multigpu.yaml
one grid_geo_r1a 1 $G --set operation.params.ordering=geometric
one grid_geo_r1b 1 $G --set operation.params.ordering=geometric
one lap27_geo_r1 1 $L --set operation.params.ordering=geometric --set input.generate.stencil=27
one lap27_metis_r1 1 $L --set input.generate.stencil=27

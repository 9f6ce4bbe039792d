#!/bin/bash
# Stop 57, call 9 (2xH200): the GPU part test with input_made_on_device's flag; Cholesky with
# ordering: geometric at 2 GPUs once compiled (d70's 2-rank runs paid the distribution's first
# compiles): the grid 2000^2 twice, then the 7-point Laplacian 120^3.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
timeout 150 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_generators.py tests/test_parallel_input.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
S="--set peers=[] --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|analysis|distribute|upload|h2d|numeric|solve|refine|prepare|total)  "
  python3 -c "
import sys,h5py; a=h5py.File(sys.argv[1]).attrs
print('   ', {k: a.get(k) for k in ('verify_passed','verify_max_rel_error','chol_ordering','chol_factor_flops','chol_ordering_seconds','chol_symbolic_seconds','chol_logdet')})" $d/*.h5
  rm -f $d/*.h5
}
G=inputs/bench_cholesky_grid2000_multigpu.yaml
L=inputs/bench_cholesky_lap120_multigpu.yaml
one grid_geo_r2a 2 $G --set operation.params.ordering=geometric
one grid_geo_r2b 2 $G --set operation.params.ordering=geometric
one lap_geo_r2 2 $L --set operation.params.ordering=geometric

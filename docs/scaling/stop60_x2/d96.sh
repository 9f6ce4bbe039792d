#!/bin/bash
# Stop 60, call 6 (2xH200): OMP_WAIT_POLICY=PASSIVE where ranks share the node against the
# runtime's default (the tree before the change, old.tar.gz = 2a4d1d0, which sets nothing),
# alternated in one call, each tree's Numba caches and kernels made by a first run: Cholesky
# 7-pt 120^3 and the 2000^2 grid at 2 ranks, 120^3 at 4 (two a GPU); CP-ALS 20M at 2.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d96.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|analysis|distribute|partition|upload|prepare|numeric|total)  |chol_(analysis|compiled_load|ordering|symbolic)_seconds|setup_seconds"
  rm -f $d/*.h5
}
C=inputs/bench_cholesky_lap120_multigpu.yaml
G=inputs/bench_cholesky_grid2000_multigpu.yaml
T=inputs/bench_cpals_nell2_20m.yaml
for PRE in "" "$OLD"; do
  for c in $C $G $T; do timeout 200 $MP $PRE -n 2 python3 -m hisparse run $c $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
done
rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one lap_r2_new_$k 2 $C
  PRE="$OLD"; one lap_r2_old_$k 2 $C
  PRE=""; one grid_r2_new_$k 2 $G
  PRE="$OLD"; one grid_r2_old_$k 2 $G
  PRE=""; one lap_r4_new_$k 4 $C
  PRE="$OLD"; one lap_r4_old_$k 4 $C
  PRE=""; one cp_r2_new_$k 2 $T
  PRE="$OLD"; one cp_r2_old_$k 2 $T
done
date

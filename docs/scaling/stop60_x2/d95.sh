#!/bin/bash
# Stop 60, call 5 (2xH200): OMP_WAIT_POLICY=PASSIVE where ranks share the node
# (threads.wait_passively_when_shared) against the runtime's default (-x OMP_WAIT_POLICY=ACTIVE,
# what runs had before), alternated in the same call: Cholesky 7-pt 120^3 and the 2000^2 grid
# at 2 ranks, 120^3 at 4 ranks (two a GPU), 120^3 at 1 rank.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d95.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|analysis|distribute|upload|prepare|numeric|total)  |chol_(analysis|compiled_load|ordering|symbolic)_seconds|setup_seconds"
  rm -f $d/*.h5
}
C=inputs/bench_cholesky_lap120_multigpu.yaml
G=inputs/bench_cholesky_grid2000_multigpu.yaml
PRE=""
timeout 200 $MP -n 2 python3 -m hisparse run $C $S --set output.dir=$OUT/r_c > /dev/null 2>&1
timeout 200 $MP -n 2 python3 -m hisparse run $G $S --set output.dir=$OUT/r_c > /dev/null 2>&1; rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one lap_r2_passive_$k 2 $C
  PRE="-x OMP_WAIT_POLICY=ACTIVE"; one lap_r2_active_$k 2 $C
  PRE=""; one grid_r2_passive_$k 2 $G
  PRE="-x OMP_WAIT_POLICY=ACTIVE"; one grid_r2_active_$k 2 $G
  PRE=""; one lap_r4_passive_$k 4 $C
  PRE="-x OMP_WAIT_POLICY=ACTIVE"; one lap_r4_active_$k 4 $C
done
PRE=""; one lap_r1 1 $C
PRE=""; one grid_r1 1 $G
date

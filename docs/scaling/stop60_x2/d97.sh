#!/bin/bash
# Stop 60, call 7 (2xH200): Cholesky's other ranks copy the matrix on one thread beside rank 0's
# load and analysis (threads.beside) against the tree before (old.tar.gz = 70a9c36), alternated,
# each tree's caches made first: 7-pt 120^3 and the 2000^2 grid at 2 ranks, 120^3 at 4 (two a
# GPU). (d95/d96: OMP_WAIT_POLICY=PASSIVE for every rank was measured and not adopted.)
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d97.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 200 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|analysis|distribute|upload|prepare|numeric|total)  |chol_(analysis|compiled_load)_seconds|setup_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
C=inputs/bench_cholesky_lap120_multigpu.yaml
G=inputs/bench_cholesky_grid2000_multigpu.yaml
for PRE in "" "$OLD"; do
  for c in $C $G; do timeout 200 $MP $PRE -n 2 python3 -m hisparse run $c $S --set verify.enabled=false --set output.dir=$OUT/r_c > /dev/null 2>&1; done
done
rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one lap_r2_new_$k 2 $C --set verify.enabled=false
  PRE="$OLD"; one lap_r2_old_$k 2 $C --set verify.enabled=false
  PRE=""; one grid_r2_new_$k 2 $G --set verify.enabled=false
  PRE="$OLD"; one grid_r2_old_$k 2 $G --set verify.enabled=false
  PRE=""; one lap_r4_new_$k 4 $C --set verify.enabled=false
  PRE="$OLD"; one lap_r4_old_$k 4 $C --set verify.enabled=false
done
PRE=""; one lap_r2_verified 2 $C --set run.repeats=1
date

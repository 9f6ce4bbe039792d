#!/bin/bash
# Stop 60, call 4 (2xH200): rank 0's compiled-analysis load against the rank count and what the
# other ranks do meanwhile (warmup_probe.py), Numba's threading layer, OMP_WAIT_POLICY.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d94.log) 2>&1
MP="mpirun --bind-to none -x OMPI_MCA_pml=ob1"
W=docs/scaling/stop60_x2/warmup_probe.py
date
$MP -n 1 python3 $W  # compiles into the cache if it is empty
for k in 1 2; do
  for n in 1 2 4; do
    for o in load sleep; do OTHERS=$o $MP -x OTHERS -n $n python3 $W; done
  done
done
echo "== OMP_WAIT_POLICY=passive"
for n in 2 4; do OMP_WAIT_POLICY=passive OTHERS=load $MP -x OTHERS -x OMP_WAIT_POLICY -n $n python3 $W; done
echo "== NUMBA_THREADING_LAYER=workqueue"
for n in 1 2 4; do NUMBA_THREADING_LAYER=workqueue OTHERS=load $MP -x OTHERS -x NUMBA_THREADING_LAYER -n $n python3 $W; done
date

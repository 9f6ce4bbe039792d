#!/bin/bash
# For a 2-GPU machine (nvidia-h200-x2; prepared in stop 62, run when one is lent): CP-ALS's
# exchange beside the next MTTKRP on NCCL (stop 62; stop 63 added the iteration's last mode, the
# MTTKRP's first part on a stream of its own and solve_rows' longer blocks: the tree now holds
# all of them, f27d9dd none). The CP-ALS GPU tests that need two GPUs (NCCL
# inside the graphs), then the 20M benchmark at 1 and 2 GPUs against f27d9dd (old.tar.gz:
# `git archive f27d9dd app kernels_cu`, app renamed hisparse), compiled first, alternated,
# every phase of the 2-GPU runs launched (gpu.graphs=false) once for the exchange's share.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/x2_cpals.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date; nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -m gpu -n 4 -q -o addopts="" -p no:cacheprovider tests/test_cpals.py \
  -k "transports or graphs_replay or fits_match" > $OUT/suite_x2.log 2>&1; tail -2 $OUT/suite_x2.log
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
for PRE in "" "$OLD"; do for n in 1 2; do timeout 60 $MP $PRE -n $n python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; done; done
rm -rf $OUT/r_c
for k in a b; do
  for v in new old; do
    PRE=""; [ $v = old ] && PRE="$OLD"
    for n in 1 2; do
      d=$OUT/r_$v$k$n; mkdir -p $d
      timeout 60 $MP $PRE -n $n python3 -m hisparse run $C --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
      echo "== $v $k ranks $n"; python3 $P $d/*.h5 | grep -E "tts|  (startup|distribute|total)  "
      rm -f $d/*.h5
    done
  done
done
for v in new old; do
  PRE=""; [ $v = old ] && PRE="$OLD"
  d=$OUT/r_l$v; mkdir -p $d
  timeout 60 $MP $PRE -n 2 python3 -m hisparse run $C --set gpu.graphs=false --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $v launched, ranks 2"; python3 $P $d/*.h5 | grep -E "  (mttkrp|solve|exchange|gram|fit|total)  "
  rm -f $d/*.h5
done
date

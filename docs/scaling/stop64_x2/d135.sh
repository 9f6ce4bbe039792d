#!/bin/bash
# Stop 64 on nvidia-h200-x2, second call: SpTV resident 77M and SpMV R-MAT 23 (20 chained) at 1
# and 2 GPUs on this code (compiled first with one repeat, then timed once each).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d135.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set verify.enabled=false --quiet"
for spec in "bench_sptv_nell2_multigpu" "bench_spmv_rmat --set input.generate.scale=23"; do
  set -- $spec; c=$1; shift
  for n in 1 2; do timeout 90 $MP -n $n python3 -m hisparse run inputs/$c.yaml $S --set run.repeats=1 "$@" --set output.dir=$OUT/r_c > /dev/null 2>&1; done
  rm -rf $OUT/r_c
  for n in 1 2; do
    d=$OUT/r_$c$n; mkdir -p $d
    timeout 90 $MP -n $n python3 -m hisparse run inputs/$c.yaml $S --set run.repeats=5 "$@" --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== $c ranks $n"; python3 $P $d/*.h5 | grep -E "tts|  (startup)  "
    python3 -c "import sys,glob,h5py; a=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs; print('   median_total_ms %.4f tts %.3f' % (a['median_total_seconds']*1e3, a['time_to_solution_seconds']))" $d
    rm -f $d/*.h5
  done
done
date

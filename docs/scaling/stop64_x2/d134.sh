#!/bin/bash
# Stop 64 on nvidia-h200-x2 (lent for the stop's last device minutes): stop 62's prepared
# CP-ALS comparison (x2_cpals.sh: the NCCL GPU tests of CP-ALS, the 20M benchmark at 1 and 2
# GPUs, this tree against f27d9dd, alternated), then this code's SpGEMM 27-pt 128^3 and R-MAT 18
# and SpMV 27-pt 160^3 at 1 and 2 GPUs (compiled first, then twice each), one rank per GPU, NCCL.
cd "$(dirname "$0")/../../.."
bash docs/scaling/stop62_h200/x2_cpals.sh
exec > >(tee $OUT/d134.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
for c in bench_spgemm_poisson27_128 bench_spgemm_rmat18 bench_spmv_scaling; do
  for n in 1 2; do timeout 60 $MP -n $n python3 -m hisparse run inputs/$c.yaml $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
  rm -rf $OUT/r_c
  for k in a b; do for n in 1 2; do
    d=$OUT/r_$c$k$n; mkdir -p $d
    timeout 60 $MP -n $n python3 -m hisparse run inputs/$c.yaml $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== $c $k ranks $n"; python3 $P $d/*.h5 | grep -E "tts|  (startup|total)  "
    python3 -c "import sys,glob,h5py; a=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs; print('   median_total_ms %.3f' % (a['median_total_seconds']*1e3))" $d
    rm -f $d/*.h5
  done; done
done
date

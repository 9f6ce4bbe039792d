#!/bin/bash
# Stop 64, call 7 (one H200): does SpGEMM's slower symbolic pass per row on 128x128x64 (d129)
# follow the grid's extents or its row count? The 27-point square at several shapes, twice.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d130.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
for k in a b; do for dims in 128,128,128 128,128,64 64,128,128 128,64,128 128,128,96 128,128,112 96,96,96; do
  d=$OUT/s; mkdir -p $d
  timeout 150 $MP -n 1 python3 -m hisparse run inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[$dims]" --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  python3 -c "import sys,glob,h5py; a=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs; print(sys.argv[2], 'median_ms %.2f' % (a['median_total_seconds']*1e3), 'gflops %.1f' % a['gflops'], 'rows', a['global_rows'])" $d "$dims $k"
  rm -f $d/*.h5
done; done
date

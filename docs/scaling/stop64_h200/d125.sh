#!/bin/bash
# Stop 64, call 2 (one H200): where d124's shares lose. SpMV 27-pt: the kernels of one
# repetition by Nsight Compute at full size and at 4 ranks' share (160x160x40); SpGEMM 27-pt
# 128x128x{128,64,32} and SpTV 77M / half / quarter: every phase (d124 grepped too little).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d125.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
for z in 160 40; do
  echo "== ncu spmv 160x160x$z"
  timeout 200 ncu --clock-control none -k 'regex:csr5_spmv|csr5_calibrate|scale_sum_squares' --launch-skip 12 --launch-count 12 \
    --metrics gpu__time_duration.sum,launch__grid_size,dram__bytes.sum \
    python3 -m hisparse run inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,$z]" --set peers=[] --set run.repeats=1 --set run.warmup=0 \
      --set gpu.graphs=false --set verify.enabled=false --set output.dir=$OUT/r_ncu > $OUT/ncu_$z.txt 2>&1
  grep -E "csr5_spmv|csr5_calibrate|scale_sum_squares|gpu__time_duration|launch__grid_size|dram__bytes" $OUT/ncu_$z.txt | head -48
done
rm -rf $OUT/r_ncu
date
share() {
  local name=$1; shift
  d=$OUT/s_$name; mkdir -p $d
  timeout 150 $MP -n 1 python3 -m hisparse run "$@" --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $name"; python3 $P $d/*.h5 | grep -v "^    "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print({k: a[k] for k in a if any(s in k for s in ('nnz','flops','bins','rows','products','gflop'))})" $d/*.h5
  rm -f $d/*.h5
}
for z in 128 64 32; do share spgemm27_128x128x$z inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[128,128,$z]"; done
for n in 76879419 19219855; do share sptv_$n inputs/bench_sptv_nell2_multigpu.yaml --set input.generate.nnz=$n; done
date

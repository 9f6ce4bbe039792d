#!/bin/bash
# Stop 64, call 4 (one H200): the SpMV shares again with sigma 27, what a rank of the 160^3 run
# takes at 2 and 4 ranks (the plan's sigma follows the global mean row length, 26.66; a
# 160x160x40 run alone takes 26 from its own 26.33): per-repeat totals at full size, half and
# quarter, twice, and the kernels' durations at the quarter by Nsight Compute.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d127.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
share() {
  local name=$1; shift
  d=$OUT/s_$name; mkdir -p $d
  timeout 150 $MP -n 1 python3 -m hisparse run "$@" --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $name"; python3 $P $d/*.h5 | grep -E "tts|  (total)  "
  rm -f $d/*.h5
}
for k in a b; do
  for z in 160 80 40; do for s in 27 26; do share spmv27_160x160x${z}_sigma$s$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,$z]" --set operation.params.sigma=$s; done; done
done
echo "== ncu spmv 160x160x40 sigma 27"
timeout 200 ncu --clock-control none -k 'regex:csr5_spmv|csr5_calibrate|scale_sum_squares' --launch-skip 12 --launch-count 6 \
  --metrics gpu__time_duration.sum,launch__grid_size,dram__bytes.sum,smsp__thread_inst_executed_per_inst_executed.ratio \
  python3 -m hisparse run inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,40]" --set operation.params.sigma=27 --set peers=[] --set run.repeats=1 --set run.warmup=0 \
    --set gpu.graphs=false --set verify.enabled=false --set output.dir=$OUT/r_ncu > $OUT/ncu27_40.txt 2>&1
grep -E "csr5_spmv|csr5_calibrate|scale_sum_squares|gpu__time_duration|dram__bytes|thread_inst" $OUT/ncu27_40.txt | head -30
rm -rf $OUT/r_ncu
date

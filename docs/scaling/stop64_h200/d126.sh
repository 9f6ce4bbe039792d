#!/bin/bash
# Stop 64, call 3 (one H200): the SpMV chain's step (next_x_probe.py), and Nsight Compute's
# sections for csr5_spmv at full size (160^3) and at 4 ranks' share (160x160x40).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d126.log) 2>&1
date
python3 docs/scaling/stop64_h200/next_x_probe.py
date
for z in 160 40; do
  echo "== ncu csr5_spmv 160x160x$z"
  timeout 200 ncu --clock-control none -k 'regex:csr5_spmv' --launch-skip 6 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    python3 -m hisparse run inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,$z]" --set peers=[] --set run.repeats=1 --set run.warmup=0 \
      --set gpu.graphs=false --set verify.enabled=false --set output.dir=$OUT/r_ncu > $OUT/ncus_$z.txt 2>&1
  sed -n '/csr5_spmv/,$p' $OUT/ncus_$z.txt | grep -vE "^ *-+ *$|OPT|INF|^ *$|Section:" | head -90
done
rm -rf $OUT/r_ncu
date

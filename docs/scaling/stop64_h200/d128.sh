#!/bin/bash
# Stop 64, call 5 (one H200): CSR5's default sigma from the census of row lengths (the length
# at least half the rows share, in [16, 32]; else the mean's): the SpMV GPU tests; 27-point
# matrices whose mean row length rounds below 27, each with the new default (27) and the old
# one set by hand, alternated; Nsight Compute's sections of the chain's scale_sum_squares at
# 4 ranks' share.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d128.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv.py tests/test_spmv_csr5.py tests/test_spmv_distributed.py tests/test_spmv_checkerboard.py > $OUT/suite_d128.log 2>&1; tail -3 $OUT/suite_d128.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d128.log | head -20
date
run() {
  local name=$1; shift
  d=$OUT/s_$name; mkdir -p $d
  timeout 150 $MP -n 1 python3 -m hisparse run "$@" --set peers=[] --set verify.enabled=true --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $name"; python3 $P $d/*.h5 | grep -E "tts|  (total)  "
  python3 -c "import sys,h5py; a=h5py.File(sys.argv[1]).attrs; print('   sigma', a['csr5_sigma'], 'verify', a['verify_passed'])" $d/*.h5
  rm -f $d/*.h5
}
for k in a b; do
  run q40_default$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,40]" --set run.repeats=5
  run q40_sigma26$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,40]" --set run.repeats=5 --set operation.params.sigma=26
  run p100_default$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[100,100,100]" --set run.repeats=5
  run p100_sigma26$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[100,100,100]" --set run.repeats=5 --set operation.params.sigma=26
  run small_default$k inputs/bench_spmv_small.yaml
  run small_sigma25$k inputs/bench_spmv_small.yaml --set operation.params.sigma=25
done
date
echo "== ncu scale_sum_squares 160x160x40"
timeout 200 ncu --clock-control none -k 'regex:scale_sum_squares|csr5_calibrate' --launch-skip 10 --launch-count 2 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
  python3 -m hisparse run inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,40]" --set peers=[] --set run.repeats=1 --set run.warmup=0 \
    --set gpu.graphs=false --set verify.enabled=false --set output.dir=$OUT/r_ncu > $OUT/ncu_scale.txt 2>&1
grep -E "scale_sum_squares|csr5_calibrate|Duration|Throughput|Active Warps|Eligible|Warp Cycles|Waves|Achieved Occ|stalled" $OUT/ncu_scale.txt | head -60
rm -rf $OUT/r_ncu
date

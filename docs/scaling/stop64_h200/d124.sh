#!/bin/bash
# Stop 64, call 1 (one H200; no multi-GPU kind lent): the review's GPU-side mends (mttkrp.cu's
# unfolding_indptr through first_row_at_least; CP-ALS's _join_deferred through
# join_side_streams; background_work listing the capture once; SpMV holding its plan) under the
# whole GPU suite and memcheck of the CP-ALS sort at 1 and 2 ranks; then the "shares" study: each
# strong series' input at one GPU at full size and at one rank's share at 2 and 4 ranks (what a
# rank computes there, without the exchange), to split 4-GPU efficiency into the kernels' own
# and the rest.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d124.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 420 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite_d124.log 2>&1; tail -3 $OUT/suite_d124.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d124.log | head -20
date
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=2 --set run.warmup=0 --set operation.params.max_iters=4 --set operation.params.tol=0 --set input.generate.nnz=200000 --set verify.enabled=true"
for spec in "1 memcheck false" "2 memcheck false" "1 memcheck true"; do
  set -- $spec
  timeout 200 $MP -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=unfolding_indptr|mttkrp_nnz_team|deferred_normalize|scale_columns' \
    python3 -m hisparse run $SMALL --set gpu.graphs=$3 --set output.dir=$OUT/san > $OUT/san_$1_$2_$3.log 2>&1
  echo "ranks $1 $2 graphs $3: rc $? $(grep -E 'ERROR SUMMARY' $OUT/san_$1_$2_$3.log | tail -3 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2_$3.log) written"
done
rm -rf $OUT/san
date
share() {  # name, config and settings: one GPU, 5 repeats, the per-repeat total and the kernel phases
  local name=$1; shift
  d=$OUT/s_$name; mkdir -p $d
  timeout 150 $MP -n 1 python3 -m hisparse run "$@" --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $name"; python3 $P $d/*.h5 | grep -E "tts|  (total|kernel|compute|product|mttkrp)  "
  rm -f $d/*.h5
}
for k in a b; do
  for z in 160 80 40; do share spmv27_160x160x$z$k inputs/bench_spmv_scaling.yaml --set "input.generate.dims=[160,160,$z]"; done
  for z in 128 64 32; do share spgemm27_128x128x$z$k inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[128,128,$z]"; done
  for n in 76879419 38439710 19219855; do share sptv_$n$k inputs/bench_sptv_nell2_multigpu.yaml --set input.generate.nnz=$n; done
done
date

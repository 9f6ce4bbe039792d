#!/bin/bash
# Stop 63, call 5 (one H200): the whole GPU suite after this stop's changes (Cholesky's op.py
# split into problem/refinement/tree, SpMV's plan.py, hisparse jobs as a package, CP-ALS's carry
# and solve blocks), then every operation's verified run at 1 rank and at 2 ranks sharing the
# GPU (Cholesky's subtree strategy through tree.py, SpMV's plan through plan.py), each with its
# exit code and time to solution.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d120.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
timeout 420 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite_d120.log 2>&1; tail -3 $OUT/suite_d120.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d120.log | head -30
date
S="--set peers=[] --set run.repeats=2 --set verify.enabled=true --quiet"
for c in "1 inputs/quickstart.yaml --set backend=gpu" "1 inputs/bench_cpals_small.yaml" \
         "1 inputs/bench_spmv_rmat.yaml" "1 inputs/bench_cholesky_lap60.yaml" \
         "1 inputs/bench_sptv_small.yaml" "1 inputs/bench_spgemm_rmat18.yaml" \
         "2 inputs/bench_spmv_rmat.yaml" "2 inputs/bench_spmv_rmat.yaml --set partition.strategy=checkerboard" \
         "2 inputs/bench_cholesky_lap60.yaml" "2 inputs/bench_cholesky_lap60.yaml --set operation.params.subtree_exchange=host" \
         "2 inputs/bench_cpals_small.yaml" "2 inputs/bench_sptv_small.yaml" "2 inputs/bench_spgemm_rmat18.yaml"; do
  set -- $c; n=$1; shift
  d=$OUT/r; mkdir -p $d
  timeout 150 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1; rc=$?
  echo "$n ranks $*: rc $rc $(python3 -c "import sys,h5py,glob; a=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs; print('verify', a.get('verify_passed'), 'tts', round(float(a['time_to_solution_seconds']),2))" $d 2>/dev/null)"
  [ $rc = 0 ] || tail -5 $OUT/last.log
  rm -rf $d
done
date

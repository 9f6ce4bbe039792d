#!/bin/bash
# Stop 61, call 4 (one H200): the Cholesky GPU suites after symbolic.py's split into modules; the
# analysis and the compiled load against the tree just before the split (old.tar.gz = 3b5b889),
# alternated after a compiling run of each: 7-pt 120^3 at 1 rank, and at 2 ranks sharing the GPU.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d101.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 240 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider -rfE \
  tests/test_cholesky.py tests/test_cholesky_subtree.py tests/test_cholesky_geometric.py \
  > $OUT/suite_d101.log 2>&1
echo "suite rc $?"; grep -v "PytestBenchmarkWarning\|warner(" $OUT/suite_d101.log | tail -5
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=2 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|analysis|distribute|upload|numeric)  |chol_(analysis|compiled_load)_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
C="inputs/bench_cholesky_lap120_multigpu.yaml --set verify.enabled=false"
for PRE in "" "$OLD"; do
  for n in 1 2; do timeout 150 $MP $PRE -n $n python3 -m hisparse run $C $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
done
rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one lap_r1_new_$k 1 $C
  PRE="$OLD"; one lap_r1_old_$k 1 $C
  PRE=""; one lap_r2_new_$k 2 $C
  PRE="$OLD"; one lap_r2_old_$k 2 $C
done
PRE=""; one lap_r2_verified 2 inputs/bench_cholesky_lap120_multigpu.yaml --set run.repeats=1
date

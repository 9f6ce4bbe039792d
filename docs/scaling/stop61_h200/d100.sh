#!/bin/bash
# Stop 61, call 3 (one H200): the whole GPU suite after the generators' split into a package and
# the SpMV plan's methods; R-MAT 23 at one GPU against the tree before this stop (old.tar.gz =
# 8aab62d), alternated after a compiling run of each (the generators' code moved: the read must
# not change), R-MAT 21 verified at 1 and 2 ranks; why NumPy's import is slow here (numpy_probe.sh).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d100.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 330 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider -rfE tests \
  > $OUT/suite_d100.log 2>&1
echo "suite rc $?"; grep -v "PytestBenchmarkWarning\|warner(" $OUT/suite_d100.log | tail -8
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total|collect)  "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
for PRE in "" "$OLD"; do timeout 150 $MP $PRE -n 1 python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
rm -rf $OUT/r_c
for k in a b; do
  PRE=""; one rmat23_r1_new_$k 1 $R
  PRE="$OLD"; one rmat23_r1_old_$k 1 $R
done
PRE=""; one rmat21_r1_verified 1 inputs/bench_spmv_rmat.yaml --set run.repeats=1
PRE=""; one rmat21_r2_verified 2 inputs/bench_spmv_rmat.yaml --set run.repeats=1
bash docs/scaling/stop61_h200/numpy_probe.sh
date

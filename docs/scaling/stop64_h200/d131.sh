#!/bin/bash
# Stop 64, call 8 (one H200): SpGEMM's hash tables with Fibonacci hashing (new.tar.gz = the
# working tree) against col * 107's low bits (old.tar.gz = 46cfe6a): the SpGEMM GPU tests;
# memcheck and racecheck on a small run; per-repeat totals of stencils and R-MAT 18, the trees
# alternated, twice (27-pt 80^3, 5-pt 2048^2 and R-MAT 18 verified).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d131.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
for v in new old; do mkdir -p /tmp/$v && tar -xzf .device/$v.tar.gz -C /tmp/$v; done
NEW="-x PYTHONPATH=/tmp/new:$PYTHONPATH"; OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spgemm.py tests/test_spgemm_input.py tests/test_spgemm_partition.py > $OUT/suite_d131.log 2>&1; tail -3 $OUT/suite_d131.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d131.log | head -20
date
SMALL="inputs/bench_spgemm_poisson27_80.yaml --set peers=[] --set run.repeats=1 --set run.warmup=0 --set input.generate.dims=[24,24,16] --set verify.enabled=true"
for spec in "1 memcheck" "1 racecheck" "2 memcheck"; do
  set -- $spec
  timeout 200 $MP $NEW -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=symbolic|numeric' \
    python3 -m hisparse run $SMALL --set output.dir=$OUT/san > $OUT/san_$1_$2.log 2>&1
  echo "ranks $1 $2: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$1_$2.log | tail -2 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2.log) written"
done
RM="inputs/bench_spgemm_rmat18.yaml --set peers=[] --set verify.enabled=true --set output.dir=$OUT/s"
timeout 120 $MP $NEW -n 1 compute-sanitizer --tool memcheck --kernel-regex 'kns=symbolic|numeric' python3 -m hisparse run $RM --set run.repeats=1 --set run.warmup=0 > $OUT/san_rmat.log 2>&1
echo "rmat18 memcheck: rc $? $(grep -E 'ERROR SUMMARY' $OUT/san_rmat.log | tail -1)"
rm -rf $OUT/san $OUT/s
date
one() {  # tree, label, config and settings
  local tree=$1 label=$2; shift 2
  PRE="$NEW"; [ $tree = old ] && PRE="$OLD"
  d=$OUT/s; mkdir -p $d
  timeout 150 $MP $PRE -n 1 python3 -m hisparse run $1 --set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set output.dir=$d "${@:2}" > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  python3 -c "import sys,glob,h5py; a=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs; print('%-4s %-22s median_ms %8.2f gflops %6.1f verify %s' % (sys.argv[2], sys.argv[3], a['median_total_seconds']*1e3, a['gflops'], a['verify_passed']))" $d $tree "$label"
  rm -f $d/*.h5
}
for v in new old; do
  one $v 27pt_64x128x128 inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[64,128,128]"
  one $v 27pt_96 inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[96,96,96]"
  one $v 27pt_80 inputs/bench_spgemm_poisson27_80.yaml --set verify.enabled=true
  one $v 5pt_2048 inputs/bench_spgemm_poisson5_2048.yaml --set verify.enabled=true
done
for k in a b; do for v in new old; do
  one $v 27pt_128 inputs/bench_spgemm_poisson27_128.yaml
  one $v 27pt_128x128x64 inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[128,128,64]"
  one $v rmat18 inputs/bench_spgemm_rmat18.yaml --set verify.enabled=true
done; done
date

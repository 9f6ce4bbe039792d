#!/bin/bash
# Stop 62, call 3 (one H200): CP-ALS with the exchange forked beside the next MTTKRP's first
# part and every mode's normalisation but the last deferred (deferred_normalize, scale_columns;
# the 'fast' kernel's two parts, solve_rows' <U, M> scale). The CP-ALS GPU suites; memcheck and
# racecheck on a small run at 1 rank and memcheck at 2 ranks sharing the GPU (MPI transport);
# the 20M benchmark at one GPU against the tree before (old.tar.gz = f27d9dd), alternated.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d107.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_cpals.py tests/test_cpals_ranks.py tests/test_cpals_input.py > $OUT/suite_d107.log 2>&1; tail -4 $OUT/suite_d107.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d107.log | head -20
date
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=1 --set run.warmup=0 --set operation.params.max_iters=3 --set input.generate.nnz=200000 --set verify.enabled=true"
for spec in "1 memcheck 16 true" "1 memcheck 16 false" "1 racecheck 16 false" "1 memcheck 70 false" "2 memcheck 16 false"; do
  set -- $spec
  timeout 200 $MP -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=deferred_normalize|scale_columns|solve_rows|mttkrp_nnz_team|normalize_factor' \
    python3 -m hisparse run $SMALL --set operation.params.rank=$3 --set gpu.graphs=$4 --set output.dir=$OUT/san > $OUT/san_$1_$2_$3_$4.log 2>&1
  echo "ranks $1 $2 rank $3 graphs $4: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$1_$2_$3_$4.log | tail -2 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2_$3_$4.log) written"
done
rm -rf $OUT/san
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
for PRE in "" "$OLD"; do timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; done
rm -rf $OUT/r_c
for k in a b; do
  for v in new old; do
    PRE=""; [ $v = old ] && PRE="$OLD"
    for g in true false; do
      d=$OUT/r_$v$k$g; mkdir -p $d
      timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set gpu.graphs=$g --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
      echo "== $v $k graphs $g"; python3 $P $d/*.h5 | grep -E "tts|  (mttkrp|solve|exchange|gram|total)  "
      rm -f $d/*.h5
    done
  done
done
echo "== 2 ranks sharing the GPU, verified (bench_cpals_small)"
for n in 2 3; do
  timeout 120 $MP -n $n python3 -m hisparse run inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=2 --set verify.enabled=true --set output.dir=$OUT/v$n > $OUT/v$n.log 2>&1
  python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print('ranks', sys.argv[2], 'verify', a.get('verify_passed'), a.get('verify_error'))" $OUT/v$n $n || tail -5 $OUT/v$n.log
done
rm -rf $OUT/v2 $OUT/v3
date

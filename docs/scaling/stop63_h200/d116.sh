#!/bin/bash
# Stop 63, call 1 (one H200): the CP-ALS GPU engine after its device sort moved to device_sort.py
# and the dense kernels' lambda/Gram and column division became shared device functions
# (0d4d04d, run from new.tar.gz = git archive of it, so that other work in the tree is not in
# it). The CP-ALS and graph GPU suites; memcheck and racecheck on a small run (graphs on and
# off, rank 16 and 70, 1 and 2 ranks sharing the GPU); the 20M benchmark at one GPU against
# db71039 (old.tar.gz), alternated; verified at 2 and 3 ranks sharing the GPU.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d116.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
for v in new old; do mkdir -p /tmp/$v && tar -xzf .device/$v.tar.gz -C /tmp/$v; done
NEW="-x PYTHONPATH=/tmp/new:$PYTHONPATH"; OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
PYTHONPATH=/tmp/new:$PYTHONPATH python3 -c "import hisparse, sys; print('tests use', hisparse.__file__)"
PYTHONPATH=/tmp/new:$PYTHONPATH timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_cpals.py tests/test_cpals_ranks.py tests/test_cpals_input.py tests/test_gpu_layer.py > $OUT/suite_d116.log 2>&1; tail -4 $OUT/suite_d116.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d116.log | head -20
date
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=1 --set run.warmup=0 --set operation.params.max_iters=3 --set input.generate.nnz=200000 --set verify.enabled=true"
for spec in "1 memcheck 16 true" "1 memcheck 16 false" "1 racecheck 16 false" "1 memcheck 70 false" "2 memcheck 16 false"; do
  set -- $spec
  timeout 200 $MP $NEW -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=deferred_normalize|scale_columns|normalize_factor|gram_inverse|unfolding' \
    python3 -m hisparse run $SMALL --set operation.params.rank=$3 --set gpu.graphs=$4 --set output.dir=$OUT/san > $OUT/san_$1_$2_$3_$4.log 2>&1
  echo "ranks $1 $2 rank $3 graphs $4: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$1_$2_$3_$4.log | tail -2 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2_$3_$4.log) written"
done
rm -rf $OUT/san
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
for PRE in "$NEW" "$OLD"; do timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; done
rm -rf $OUT/r_c
for k in a b c; do
  for v in new old; do
    PRE="$NEW"; [ $v = old ] && PRE="$OLD"
    d=$OUT/r_$v$k; mkdir -p $d
    timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== $v $k"; python3 $P $d/*.h5 | grep -E "tts|  (format|mttkrp|solve|gram|total)  "
    rm -f $d/*.h5
  done
done
echo "== ranks sharing the GPU, verified (bench_cpals_small), both kernels"
for n in 2 3; do for kern in fast seed; do
  timeout 120 $MP $NEW -n $n python3 -m hisparse run inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=2 --set verify.enabled=true --set operation.params.mttkrp=$kern --set output.dir=$OUT/v$n > $OUT/v$n.log 2>&1
  python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print('ranks', sys.argv[2], sys.argv[3], 'verify', a.get('verify_passed'), a.get('verify_error'))" $OUT/v$n $n $kern || tail -5 $OUT/v$n.log
  rm -rf $OUT/v$n
done; done
date

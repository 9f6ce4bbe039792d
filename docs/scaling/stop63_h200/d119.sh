#!/bin/bash
# Stop 63, call 4 (one H200): CP-ALS with an iteration's last mode exchanged beside the next
# iteration's first MTTKRP (d135e75, from new.tar.gz). The CP-ALS and graph GPU suites;
# memcheck and racecheck on a small run (graphs on and off, rank 16 and 70, 1 and 2 ranks);
# verified runs (1 rank with graphs: tol 0 and 1e-4, 3 repeats so that replays run, and
# checkpoints; 2 and 3 ranks sharing the GPU, both kernels, tol 0 and 1e-4); the 20M benchmark
# at one GPU against 471fd53 (old.tar.gz), alternated.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d119.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
for v in new old; do mkdir -p /tmp/$v && tar -xzf .device/$v.tar.gz -C /tmp/$v; done
NEW="-x PYTHONPATH=/tmp/new:$PYTHONPATH"; OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
PYTHONPATH=/tmp/new:$PYTHONPATH timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_cpals.py tests/test_cpals_ranks.py tests/test_cpals_input.py tests/test_cpals_progress.py tests/test_gpu_layer.py > $OUT/suite_d119.log 2>&1; tail -3 $OUT/suite_d119.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d119.log | head -20
date
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=2 --set run.warmup=0 --set operation.params.max_iters=4 --set operation.params.tol=0 --set input.generate.nnz=200000 --set verify.enabled=true"
for spec in "1 memcheck 16 true" "1 memcheck 16 false" "1 racecheck 16 false" "1 memcheck 70 true" "2 memcheck 16 false"; do
  set -- $spec
  timeout 200 $MP $NEW -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=deferred_normalize|scale_columns|normalize_factor|solve_rows|mttkrp_nnz_team' \
    python3 -m hisparse run $SMALL --set operation.params.rank=$3 --set gpu.graphs=$4 --set output.dir=$OUT/san > $OUT/san_$1_$2_$3_$4.log 2>&1
  echo "ranks $1 $2 rank $3 graphs $4: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$1_$2_$3_$4.log | tail -2 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2_$3_$4.log) written"
done
rm -rf $OUT/san
date
V="inputs/bench_cpals_small.yaml --set peers=[] --set verify.enabled=true"
show() { python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print(sys.argv[2], 'verify', a.get('verify_passed'), a.get('verify_error'), 'graphs', a.get('cpals_graphs'), 'iters', len(f['result/fit'][()]) if 'result/fit' in f else '?')" $1 "$2" || tail -5 $1.log; rm -rf $1; }
for case in "1 fast 0 true 3" "1 fast 1e-4 true 3" "1 seed 0 true 2" "1 fast 0 false 2" "2 fast 0 false 2" "2 fast 1e-4 false 2" "2 seed 0 false 2" "3 fast 0 false 2" "3 fast 1e-4 false 1"; do
  set -- $case
  timeout 120 $MP $NEW -n $1 python3 -m hisparse run $V --set operation.params.mttkrp=$2 --set operation.params.tol=$3 --set gpu.graphs=$4 --set run.repeats=$5 --set operation.params.max_iters=12 --set output.dir=$OUT/v > $OUT/v.log 2>&1
  show $OUT/v "ranks $1 $2 tol $3 graphs $4 repeats $5:"
done
for n in 1 2; do
  timeout 120 $MP $NEW -n $n python3 -m hisparse run $V --set operation.params.tol=0 --set operation.params.max_iters=10 --set operation.params.checkpoint_every=3 --set operation.params.checkpoint=$OUT/ck$n.h5 --set output.dir=$OUT/v > $OUT/v.log 2>&1
  show $OUT/v "ranks $n checkpoint_every 3:"
done
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
for PRE in "$NEW" "$OLD"; do timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; done
rm -rf $OUT/r_c
for k in a b c; do
  for v in new old; do
    PRE="$NEW"; [ $v = old ] && PRE="$OLD"
    d=$OUT/r_$v$k; mkdir -p $d
    timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== $v $k"; python3 $P $d/*.h5 | grep -E "tts|  (format|total)  "
    rm -f $d/*.h5
  done
done
date

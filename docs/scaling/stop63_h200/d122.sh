#!/bin/bash
# Stop 63, call 7 (one H200): the 'fast' MTTKRP's first part on a stream of its own into its
# own rows (new.tar.gz = HEAD) against one stream and one buffer (old.tar.gz = 06f3e32): the
# chain probe at 1, 2 and 4 ranks' sizes, both trees alternated; the CP-ALS and graph GPU
# suites; memcheck and racecheck (solve_rows and the MTTKRP changed) at 1 and 2 ranks; verified
# runs at 2 and 3 ranks sharing the GPU (where blocks are parted) and 1 rank with graphs; the
# 20M benchmark at one GPU, alternated.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d122.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
for v in new old; do mkdir -p /tmp/$v && tar -xzf .device/$v.tar.gz -C /tmp/$v; done
NEW="-x PYTHONPATH=/tmp/new:$PYTHONPATH"; OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
for k in a; do for v in new old; do
  echo "== chain $v $k"; PYTHONPATH=/tmp/$v:$PYTHONPATH python3 docs/scaling/stop63_h200/chain_probe.py 2>&1 | grep "^P="
done; done
date
PYTHONPATH=/tmp/new:$PYTHONPATH timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_cpals.py tests/test_cpals_ranks.py tests/test_cpals_input.py tests/test_cpals_progress.py tests/test_gpu_layer.py > $OUT/suite_d122.log 2>&1; tail -3 $OUT/suite_d122.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d122.log | head -20
date
SMALL="inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=2 --set run.warmup=0 --set operation.params.max_iters=4 --set operation.params.tol=0 --set input.generate.nnz=200000 --set verify.enabled=true"
for spec in "2 memcheck 16 false" "2 racecheck 16 false" "3 memcheck 70 false" "1 memcheck 16 true" "1 racecheck 16 true"; do
  set -- $spec
  timeout 200 $MP $NEW -n $1 compute-sanitizer --tool $2 --kernel-regex 'kns=solve_rows|mttkrp_nnz_team|deferred_normalize|scale_columns' \
    python3 -m hisparse run $SMALL --set operation.params.rank=$3 --set gpu.graphs=$4 --set output.dir=$OUT/san > $OUT/san_$1_$2_$3_$4.log 2>&1
  echo "ranks $1 $2 rank $3 graphs $4: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$1_$2_$3_$4.log | tail -3 | tr '\n' ' ') $(grep -c 'results written' $OUT/san_$1_$2_$3_$4.log) written"
done
rm -rf $OUT/san
date
V="inputs/bench_cpals_small.yaml --set peers=[] --set verify.enabled=true"
show() { python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print(sys.argv[2], 'verify', a.get('verify_passed'), a.get('verify_error'), 'graphs', a.get('cpals_graphs'))" $1 "$2" || tail -5 $1.log; rm -rf $1; }
for case in "1 fast 0 true 3" "2 fast 0 false 2" "2 fast 1e-4 false 2" "3 fast 0 false 2" "4 fast 1e-4 false 1" "2 seed 0 false 1"; do
  set -- $case
  timeout 120 $MP $NEW -n $1 python3 -m hisparse run $V --set operation.params.mttkrp=$2 --set operation.params.tol=$3 --set gpu.graphs=$4 --set run.repeats=$5 --set operation.params.max_iters=12 --set output.dir=$OUT/v > $OUT/v.log 2>&1
  show $OUT/v "ranks $1 $2 tol $3 graphs $4 repeats $5:"
done
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
for k in a b; do
  for v in new old; do
    PRE="$NEW"; [ $v = old ] && PRE="$OLD"
    d=$OUT/r_$v$k; mkdir -p $d
    timeout 100 $MP $PRE -n 1 python3 -m hisparse run $C --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== $v $k"; python3 $P $d/*.h5 | grep -E "tts|  (total)  "
    rm -f $d/*.h5
  done
done
date

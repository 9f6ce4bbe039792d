#!/bin/bash
# Stop 62, call 5 (one H200): the parting of the 'fast' MTTKRP's nonzeros now made by the device
# sort itself (unfolding_keys adds the late part's offset and counts the early nonzeros;
# unfolding_indptr_parts), with no CuPy kernel of its own (d108: format 0.01 -> 0.28-0.34 s at
# 2 ranks). As d108: the CP-ALS, graph, SpMV and SpTV GPU suites; the 20M benchmark at 1 and 2
# ranks sharing the GPU against f27d9dd (old.tar.gz), alternated, every setup phase.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d109.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
timeout 400 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_cpals.py tests/test_cpals_ranks.py tests/test_cpals_input.py tests/test_gpu_layer.py \
  tests/test_spmv.py tests/test_spmv_distributed.py tests/test_sptv.py > $OUT/suite_d109.log 2>&1; tail -3 $OUT/suite_d109.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d109.log | head -20
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
for PRE in "" "$OLD"; do for n in 1 2; do timeout 100 $MP $PRE -n $n python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; done; done
rm -rf $OUT/r_c
for k in a b; do
  for v in new old; do
    PRE=""; [ $v = old ] && PRE="$OLD"
    for n in 1 2; do
      d=$OUT/r_$v$k$n; mkdir -p $d
      timeout 100 $MP $PRE -n $n python3 -m hisparse run $C --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
      echo "== $v $k ranks $n"; python3 $P $d/*.h5 | grep -E "tts|  (startup|connect|read|partition|distribute|upload|format|total)  "
      rm -f $d/*.h5
    done
  done
done
date

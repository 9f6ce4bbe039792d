#!/bin/bash
# Stop 64, call 9 (one H200): SpGEMM with Fibonacci hashing against cuSPARSE in the same run
# (the benchmark configs as they are: peers [cusparse], 5 repeats), and the 2-rank run of
# 128^3 sharing the GPU, verified.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d132.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
for c in bench_spgemm_poisson27_80 bench_spgemm_poisson27_128 bench_spgemm_poisson5_2048 bench_spgemm_rmat18; do
  timeout 200 $MP -n 1 python3 -m hisparse run inputs/$c.yaml --set run.repeats=5 --set output.dir=$OUT/p > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $c"; grep -A3 "^operation" $OUT/last.log | cut -c1-400
  rm -rf $OUT/p
done
timeout 200 $MP -n 2 python3 -m hisparse run inputs/bench_spgemm_poisson27_80.yaml --set peers=[] --set run.repeats=2 --set verify.enabled=true --set output.dir=$OUT/p > $OUT/last2.log 2>&1 || tail -20 $OUT/last2.log
echo "== 2 ranks 80^3"; grep -A3 "^operation" $OUT/last2.log | cut -c1-400
rm -rf $OUT/p
date

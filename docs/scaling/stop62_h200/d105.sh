#!/bin/bash
# Stop 62, call 1 (one H200: no multi-GPU kind lent). (1) Where CP-ALS's per-mode time goes at
# 1, 2 and 4 ranks' parts of the 20M benchmark, each part alone on the GPU (mttkrp_probe.py);
# (2) R-MAT 23's plan at 1 rank and at 2 ranks sharing the GPU (MPI transport): every device
# step of the split and the degree renumbering, to see what a rank's plan spends that does
# not shrink with its share.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d105.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
timeout 300 python3 docs/scaling/stop62_h200/mttkrp_probe.py 1,2,4
date
S="--set peers=[] --set run.repeats=3 --quiet --set verify.enabled=false"
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23"
for n in 1 2; do timeout 120 $MP -n $n python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
rm -rf $OUT/r_c
for k in a b; do
  for n in 1 2; do
    d=$OUT/r_$n$k; mkdir -p $d
    timeout 120 $MP -n $n python3 -m hisparse run $R $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== rmat23 r$n $k"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total)  |plan_"
    rm -f $d/*.h5
  done
done
date

#!/bin/bash
# session 53, call 5 (x2): SpGEMM 27-pt 128^3, where the 2-rank repeat loses 2.7 ms: the
# per-repeat total at 1 rank and at 2 by partition (row_modulo as shipped, row_blocks,
# nnz_balanced, flops_balanced), 5 repeats each; the per-kernel GPU time of each rank by ncu
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d40.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
S="inputs/bench_spgemm_poisson27_128.yaml --set peers=[] --set run.repeats=5 --quiet"
timeout 60 hisparse run $S --set output.dir=$OUT/g/r1 > /dev/null 2>&1
for st in row_modulo row_blocks nnz_balanced flops_balanced; do
  timeout 60 $M -n 2 hisparse run $S --set partition.strategy=$st --set output.dir=$OUT/g/$st > /dev/null 2>&1
done
timeout 60 hisparse run $S --set output.dir=$OUT/g/r1 > /dev/null 2>&1
hisparse report $OUT/g/r1 $OUT/g/row_modulo $OUT/g/row_blocks $OUT/g/nnz_balanced $OUT/g/flops_balanced --no-plots 2>&1 | cut -c1-220 | head -20
python3 .device/phases.py $OUT/g/*/*.h5 > $OUT/phases_spgemm.txt 2>&1
rm -rf $OUT/g
N="--set run.repeats=2 --set run.warmup=0 --set output.dir=$OUT/n"
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_r1.csv hisparse run $S $N > /dev/null 2>&1
timeout 150 $M -n 2 bash -c "ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_r2_rank\${OMPI_COMM_WORLD_RANK}.csv hisparse run $S $N" > /dev/null 2>&1
python3 .device/ncusum.py $OUT/ncu_r1.csv $OUT/ncu_r2_rank*.csv
rm -rf $OUT/n
date

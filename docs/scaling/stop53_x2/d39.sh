#!/bin/bash
# session 53, call 4 (x2): where SpGEMM 27-pt 128^3's 2-rank repeat loses 2.7 ms (per-kernel GPU
# time by ncu at 1 and 2 ranks, 2 repeats, no warm-up); the 250^3 Laplacian on 2 GPUs with the
# ordering computed in the run (the config as shipped)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d39.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
S="inputs/bench_spgemm_poisson27_128.yaml --set peers=[] --set run.repeats=2 --set run.warmup=0 --quiet"
timeout 60 hisparse run $S --set output.dir=$OUT/g 2>&1 | tail -3
timeout 60 $M -n 2 hisparse run $S --set output.dir=$OUT/g 2>&1 | tail -3
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_r1.csv hisparse run $S --set output.dir=$OUT/g > /dev/null 2>&1
timeout 120 $M -n 2 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_r2_%q{OMPI_COMM_WORLD_RANK}.csv hisparse run $S --set output.dir=$OUT/g > /dev/null 2>&1
python3 .device/ncusum.py $OUT/ncu_r1.csv $OUT/ncu_r2_*.csv
python3 .device/phases.py $OUT/g/*.h5 > $OUT/phases_spgemm.txt 2>&1; rm -f $OUT/g/*.h5
date
timeout $((560 - SECONDS)) $M -n 2 hisparse run inputs/bench_cholesky_lap250_multigpu.yaml --set peers=[] --set output.dir=$OUT/big 2>&1 | tail -12 | cut -c1-250
python3 .device/cholsum.py $OUT/big/*.h5
python3 .device/phases.py $OUT/big/*.h5 > $OUT/phases_lap250_computed.txt 2>&1; rm -f $OUT/big/*.h5
date

#!/bin/bash
# session 55, call 1 (x2): where R-MAT 23's generation goes; SpMV 27-pt 160^3 per kernel at 1 and
# 2 ranks (ncu); the file input at 1 and 2 GPUs with stop 54's sampled reach (first on a GPU host)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d52.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 150 python3 .device/rmat_probe.py 23 2>&1 | tail -12
date
S="inputs/bench_spmv_scaling.yaml --set peers=[] --set run.repeats=1 --set verify.enabled=false --quiet"
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_spmv_r1.csv hisparse run $S --set output.dir=$OUT/n1 > $OUT/ncu1.log 2>&1 || tail -5 $OUT/ncu1.log
timeout 150 $M -n 2 bash -c "ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_spmv_r2_rank\${OMPI_COMM_WORLD_RANK}.csv hisparse run $S --set output.dir=$OUT/n2" > $OUT/ncu2.log 2>&1 || tail -5 $OUT/ncu2.log
python3 .device/ncusum.py $OUT/ncu_spmv_r1.csv $OUT/ncu_spmv_r2_rank*.csv
rm -rf $OUT/n1 $OUT/n2
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -4
python3 .device/phases.py $OUT/s/*.h5 | grep -E "==|startup  |  read|plan  |upload|probe|prepare|total  |plan_"
rm -f $OUT/s/*.h5
date

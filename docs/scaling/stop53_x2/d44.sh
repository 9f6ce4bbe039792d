#!/bin/bash
# session 53, call 9 (x2): the read of 27-pt 160^3 from a file with the input checks on threads
# (1 and 2 GPUs, primed; a verified 2-GPU run), and the file's chunk size against the read
# (probe59: automatic ~100 KB chunks against 1 and 4 MiB)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d44.log) 2>&1
date
timeout 60 hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 2>&1 | tail -1
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --set input.path=/tmp/p160.h5 --id spmv160_file inputs/bench_spmv_scaling.yaml > $OUT/study_file.log 2>&1 || tail -20 $OUT/study_file.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -6
python3 .device/phases.py $OUT/s/*.h5 | grep -E "==|startup  |  read|plan  |upload|probe|prepare|total  "
rm -f $OUT/s/*.h5
timeout 60 mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set input.path=/tmp/p160.h5 --set output.dir=$OUT/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
rm -rf $OUT/v
timeout 120 python3 .device/probe59.py /tmp/p160.h5
date

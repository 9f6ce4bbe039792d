#!/bin/bash
# session 55, call 6 (x2): small R-MAT graphs by NumPy's passes (no Numba import): the SpGEMM and
# SpMV GPU tests, then SpGEMM R-MAT 18 and SpMV R-MAT 23 at 1 and 2 GPUs (time to solution)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d57.log) 2>&1
date
timeout 230 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spgemm.py tests/test_spmv.py tests/test_spmv_distributed.py tests/test_generators.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 120 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false inputs/bench_spgemm_rmat18.yaml > $OUT/study18.log 2>&1 || tail -20 $OUT/study18.log
timeout 200 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --timeout 140 --set input.generate.scale=23 inputs/bench_spmv_rmat.yaml > $OUT/study23.log 2>&1 || tail -20 $OUT/study23.log
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-230 $OUT/s/report.txt | head -6
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases_s.txt 2>&1
grep -E "==|startup  |  read|plan  |upload|probe|connect|distribute|total  " $OUT/phases_s.txt | head -60
rm -f $OUT/s/*.h5
date

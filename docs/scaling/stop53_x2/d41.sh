#!/bin/bash
# session 53, call 6 (x2): the GPU tests of SpGEMM (auto's row blocks) and SpMV (the fixed engine
# test), then the strong series at 1 and 2 GPUs on the stop's code
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d41.log) 2>&1
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spgemm.py tests/test_spgemm_partition.py tests/test_spgemm_input.py tests/test_spmv.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
timeout 200 bash jobs/scaling_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --only strong > $OUT/study.log 2>&1
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-220 $OUT/s/report.txt | head -24
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|format|upload|plan  |prepare|numeric  |total  " $OUT/phases.txt | head -80
rm -f $OUT/s/*.h5
date

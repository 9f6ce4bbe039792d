#!/bin/bash
# session 52, call 8 (x2): the tensor set-up's device steps without CuPy's scalar operands
# (arrays.operand, count_values, unravel; kernels_cu/device_arrays.cu): their GPU tests and
# memcheck, SpTV and CP-ALS at 1 and 2 ranks with the trap on SciPy's sparse package, then their
# strong series at 1 and 2 GPUs
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d35.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_arrays.py tests/test_sptv.py tests/test_tensor_input.py tests/test_cpals.py tests/test_cpals_input.py tests/test_cpals_ranks.py tests/test_partition.py tests/test_generators.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
cat > /tmp/small_counts.py <<'PY'
import cupy, numpy as np
from hisparse.arrays import count_values, unravel
v = cupy.asarray(np.repeat(np.arange(500), 37))
c = count_values(v, 600); u = unravel(cupy.arange(1000), (10, 100))
cupy.cuda.Device().synchronize(); print("counts", int(c.sum().get()))
PY
timeout 120 compute-sanitizer --tool memcheck python3 /tmp/small_counts.py 2>&1 | tail -2
date
for cfg in inputs/bench_sptv_nell2_multigpu.yaml inputs/bench_cpals_nell2_20m.yaml; do
  C="$cfg --set peers=[] --set run.repeats=5 --set verify.enabled=false"
  timeout 60 $M -n 1 hisparse run $C --set output.dir=$OUT/p > /dev/null 2>&1; timeout 60 $M -n 2 hisparse run $C --set output.dir=$OUT/p > /dev/null 2>&1
  for n in 1 2; do
    timeout 60 $M -n $n python3 .device/trap_run.py run $C --set output.dir=$OUT/p 2>&1 | grep -E "trap" | cut -c1-400
  done
done
date
timeout 150 bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set 'peers=[]' --set run.repeats=5 --set verify.enabled=false --timeout 60 inputs/bench_sptv_nell2_multigpu.yaml inputs/bench_cpals_nell2_20m.yaml > $OUT/study.log 2>&1
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-200 $OUT/s/report.txt | head -8
python3 .device/phases.py $OUT/s/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|format|upload|pack|prepare" $OUT/phases.txt
rm -f $OUT/s/*.h5 $OUT/p/*.h5
date

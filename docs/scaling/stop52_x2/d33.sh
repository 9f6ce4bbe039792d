#!/bin/bash
# session 52, call 5 (x2): the tensor generator as one device module (kernels_cu/generators.cu):
# its first compile on a fresh machine, its GPU tests and memcheck, then SpTV and CP-ALS at 1 and
# 2 ranks with a trap naming what still imports SciPy's sparse package, and their set-up phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d33.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
python3 docs/scaling/stop52_x2/probe52.py > $OUT/probe52.log 2>&1; grep -E "^(cupy|kernel|sptv|cpals)" $OUT/probe52.log
timeout 200 python3 -m pytest -m gpu -q -o addopts="" -p no:cacheprovider tests/test_tensor_input.py tests/test_generators.py 2>&1 | tail -3
cat > /tmp/small_gen.py <<'PY'
import cupy
from hisparse import generators
from hisparse.gpu import bind_device
d = bind_device(0)
s = generators.tensor_source([300, 200, 400], 200000, 0.14, mode=1, seed=1, skew=2.0)
i, v = s.fibers(xp=cupy); c = s.fiber_coordinates(cupy.arange(100), cupy)
p = generators.keyed_permutation(cupy.arange(5000), 4097, 3)
cupy.cuda.Device().synchronize(); print("small generation", len(v)); d.release()
PY
timeout 120 compute-sanitizer --tool memcheck python3 /tmp/small_gen.py 2>&1 | tail -3
mkdir -p $OUT/v
for cfg in inputs/bench_sptv_nell2_multigpu.yaml inputs/bench_cpals_nell2_20m.yaml; do
  C="$cfg --set peers=[] --set run.repeats=5 --set verify.enabled=false --set output.dir=$OUT/p"
  timeout 60 $M -n 1 hisparse run $C > /dev/null 2>&1; timeout 60 $M -n 2 hisparse run $C > /dev/null 2>&1  # prime
  for n in 1 2; do
    timeout 60 $M -n $n python3 .device/trap_run.py run $cfg --set peers=[] --set run.repeats=5 --set verify.enabled=false --set output.dir=$OUT/v 2>&1 | grep -E "trap| ok | FAIL|rror" | cut -c1-600
  done
done
python3 .device/phases.py $OUT/v/*.h5 > $OUT/phases.txt 2>&1
grep -E "==|startup  |  read|partition|distribute|format|upload|prepare|pack" $OUT/phases.txt
rm -f $OUT/v/*.h5 $OUT/p/*.h5
date

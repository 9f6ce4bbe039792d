#!/bin/bash
# session 55, call 3 (x2): the SpMV GPU tests after the ghost kernel's default; 27-pt 160^3 at 2
# ranks, ghost block CSR-vector (the new default) against CSR5, alternated; R-MAT 23 at 1 and 2
# GPUs with the edges' draws a few levels at a time (read), verified
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d54.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_spmv.py tests/test_spmv_distributed.py tests/test_spmv_checkerboard.py tests/test_spmv_csr5.py > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300
grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config args...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 90 $M -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 .device/phases.py $d/*.h5 | grep -E "tts|  (read|plan|total|kernel)  |ghost"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   ghost_format', a.get('ghost_format'), 'verified', a.get('verified'), a.get('verify_passed'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
P=inputs/bench_spmv_scaling.yaml
one s160_r1 1 $P --set verify.enabled=false
for k in 1 2 3; do
  one s160_default_$k 2 $P $([ $k != 1 ] && echo --set verify.enabled=false)
  one s160_csr5_$k 2 $P --set operation.params.ghost_format=csr5 $([ $k != 1 ] && echo --set verify.enabled=false)
done
date
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23"
one rmat23_r1 1 $R --set verify.enabled=false
one rmat23_r1b 1 $R --set verify.enabled=false
one rmat23_r2 2 $R
one rmat23_r2b 2 $R --set verify.enabled=false
date

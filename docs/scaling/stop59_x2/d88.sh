#!/bin/bash
# Stop 59, call 7 (2xH200): SpMV with reorder: degree no longer loads the renumbering's compiled
# pass during the read where the GPU will renumber the block. R-MAT 21 verified at 1 and 2
# GPUs; R-MAT 23 at 1 and 2 GPUs, each twice after a compiling run (OMPI_MCA_pml=ob1); whether
# a one-GPU run imports Numba at all.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d88.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|probe|graph|prepare|total|collect)  |plan_split|plan_reorder_seconds|plan_exchange|peak_host_bytes "
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
one compile 1 $R
for k in a b; do one r1$k 1 $R; one r2$k 2 $R; done
echo "== Numba imported by a one-GPU R-MAT 23 run:"
timeout 100 python3 -c "import sys; from hisparse.cli import main; rc = main(sys.argv[1:]); print('NUMBA', 'numba' in sys.modules); sys.exit(rc)" run $R $S --set output.dir=$OUT/r_numba | grep NUMBA
rm -rf $OUT/r_numba
one verify21_r1 1 inputs/bench_spmv_rmat.yaml --set run.repeats=2
one verify21_r2 2 inputs/bench_spmv_rmat.yaml --set run.repeats=2
date

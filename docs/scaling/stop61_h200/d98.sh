#!/bin/bash
# Stop 61, call 1 (one H200: no multi-GPU kind lent): the GPU suites after the SpMV plan's ghost
# use order on the GPU (RowsOnDevice.use_order) and the receive order folded into the ghost
# rows' move (rows(..., new_column)); R-MAT 23 at 2 ranks sharing the GPU (MPI transport: the
# plan's per-rank steps, not the products) against the tree before (old.tar.gz = 8aab62d),
# alternated; Cholesky 7-pt 120^3 at 2 and 4 ranks sharing the GPU, every rank's compiled load
# on one thread (894152d) against the same tree before it; R-MAT 21 verified at 2 ranks.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d98.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop55_x2/phases.py
date
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc
echo "== GPU tests"
timeout 240 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider \
  tests/test_spmv_distributed.py tests/test_gpu_layer.py tests/test_spmv.py > $OUT/suite_d98.log 2>&1; tail -5 $OUT/suite_d98.log
date
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
OLD="-x PYTHONPATH=/tmp/old:$PYTHONPATH"
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 150 $MP $PRE -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 $P $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|analysis|distribute|numeric|total|collect)  |plan_(split|exchange|reorder|device_(use_order|order|upload|download|sources))|chol_(analysis|compiled_load)_seconds"
  python3 -c "import sys,h5py; f=h5py.File(sys.argv[1]); a=f.attrs; print('   verify', a.get('verify_passed'), a.get('verify_error'))" $d/*.h5 2>/dev/null
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23 --set verify.enabled=false"
C="inputs/bench_cholesky_lap120_multigpu.yaml --set verify.enabled=false"
echo "== compile"
for PRE in "" "$OLD"; do
  for n in 2; do timeout 150 $MP $PRE -n $n python3 -m hisparse run $R $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
  for n in 2 4; do timeout 150 $MP $PRE -n $n python3 -m hisparse run $C $S --set output.dir=$OUT/r_c > /dev/null 2>&1; done
done
rm -rf $OUT/r_c
date
for k in a b; do
  PRE=""; one rmat23_r2_new_$k 2 $R
  PRE="$OLD"; one rmat23_r2_old_$k 2 $R
done
for k in a b; do
  PRE=""; one lap_r2_new_$k 2 $C
  PRE="$OLD"; one lap_r2_old_$k 2 $C
  PRE=""; one lap_r4_new_$k 4 $C
  PRE="$OLD"; one lap_r4_old_$k 4 $C
done
PRE=""; one rmat21_r2_verified 2 inputs/bench_spmv_rmat.yaml --set run.repeats=1
date

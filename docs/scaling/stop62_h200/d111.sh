#!/bin/bash
# Stop 62, call 7 (one H200): the whole GPU suite after this stop's CP-ALS change (with the
# kill-and-resume test now run on the GPU too), and a verified CP-ALS run at 1, 2 and 4 ranks
# sharing the GPU with graphs off (MPI transport: the exchange staged on the exchange stream).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d111.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
timeout 420 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite_d111.log 2>&1; tail -3 $OUT/suite_d111.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d111.log | head -20
date
for n in 1 2 4; do
  timeout 120 $MP -n $n python3 -m hisparse run inputs/bench_cpals_small.yaml --set peers=[] --set run.repeats=1 --set gpu.graphs=false --set verify.enabled=true --set output.dir=$OUT/v$n > $OUT/v$n.log 2>&1
  python3 -c "import sys,h5py,glob; f=h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]); a=f.attrs; print('ranks', sys.argv[2], 'verify', a.get('verify_passed'), a.get('verify_error'), 'iterations', a.get('iterations'))" $OUT/v$n $n || tail -5 $OUT/v$n.log
  rm -rf $OUT/v$n
done
date

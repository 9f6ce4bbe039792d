#!/bin/bash
# Stop 62, call 11 (one H200): the exit now waits for in_background's steps still running
# (threads._join_background): each operation's GPU run at one rank, and two at 2 ranks sharing
# the GPU, timed from the command's start to the process's exit beside the run's own time to
# solution, and a 2-rank run stopped by an error in its read (it must end at once, exit 2).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d115.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
date
S="--set peers=[] --set run.repeats=1 --quiet"
for c in "1 inputs/quickstart.yaml --set backend=gpu" "1 inputs/bench_cpals_small.yaml" \
         "1 inputs/bench_spmv_rmat.yaml" "1 inputs/bench_cholesky_lap60.yaml" \
         "1 inputs/bench_sptv_small.yaml" "1 inputs/bench_spgemm_rmat18.yaml" \
         "2 inputs/bench_spmv_rmat.yaml" "2 inputs/bench_cholesky_lap60.yaml"; do
  set -- $c; n=$1; shift
  d=$OUT/r; mkdir -p $d
  began=$(date +%s.%N)
  timeout 120 $MP -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1; rc=$?
  ended=$(date +%s.%N)
  tts=$(python3 -c "import sys,h5py,glob; print(round(float(h5py.File(glob.glob(sys.argv[1]+'/*.h5')[0]).attrs['time_to_solution_seconds']),2))" $d 2>/dev/null)
  echo "$n ranks $1: rc $rc, command $(python3 -c "print(round($ended-$began,2))") s, time to solution $tts s"
  rm -rf $d
done
printf 'run: {name: t, repeats: 1, warmup: 0}\noperation: {name: spmv}\nbackend: cpu\ninput: {path: /tmp/bad.h5}\noutput: {dir: /tmp/badout}\n' > /tmp/bad.yaml
python3 -c "import h5py,numpy as np; f=h5py.File('/tmp/bad.h5','w'); f['indptr']=np.zeros((3,3),int); f['indices']=np.zeros(0,int); f['data']=np.zeros(0); f.attrs['shape']=[8,8]; f.attrs['format']='csr'" 2>/dev/null
began=$(date +%s.%N); timeout 60 $MP -n 2 python3 -m hisparse run /tmp/bad.yaml > $OUT/bad.log 2>&1; rc=$?; ended=$(date +%s.%N)
echo "bad input, 2 ranks: rc $rc in $(python3 -c "print(round($ended-$began,2))") s: $(tail -1 $OUT/bad.log)"
date

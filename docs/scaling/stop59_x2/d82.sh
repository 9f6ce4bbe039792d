#!/bin/bash
# Stop 59, call 1 (2xH200): the GPU tests of the files stop 58's last review touched
# (662339c: optional_cupy, fits_free_memory), a start-up probe (where a rank's start-up goes,
# at 1 and 2 ranks, with Open MPI's default and its ob1 messaging layer), and SpMV 27-pt 160^3
# read from a file at 1 and 2 GPUs (each run twice; the first compiles).
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop59_x2
date
timeout 300 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_sptv.py \
  tests/test_cpals.py tests/test_cpals_input.py tests/test_cpals_ranks.py tests/test_generators.py \
  tests/test_spmv_distributed.py tests/test_gpu_layer.py tests/test_tensor_input.py 2>&1 | tail -15 > $OUT/suite_d82.log
tail -3 $OUT/suite_d82.log
date
echo "== probe: no launcher"
for i in 1 2; do python3 $P/startup_probe.py numpy cuinit ctx pycuda cupy nccl hisparse; done
echo "== probe: mpirun -n 1, then 2 (default, then --mca pml ob1)"
for n in 1 2 1 2; do PRINT_ALL=1 $MP -n $n python3 $P/startup_probe.py numpy mpi cuinit ctx cupy hisparse; done
for n in 1 2; do PRINT_ALL=1 $MP --mca pml ob1 -n $n python3 $P/startup_probe.py numpy mpi cuinit ctx cupy hisparse; done
echo "== probe: threads: cuinit+ctx before mpi"
for n in 1 2; do PRINT_ALL=1 $MP -n $n python3 $P/startup_probe.py numpy cuinit ctx mpi cupy hisparse; done
python3 -X importtime -c "import cupy; from cupy.cuda import nccl" 2>&1 | sort -t'|' -k2 -n | tail -8
date
echo "== SpMV 160^3 from a file"
hisparse generate poisson /tmp/p160.h5 'dims=[160,160,160]' stencil=27 > /dev/null
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet --set input.path=/tmp/p160.h5"
for n in 1 1 2 2 1; do
  d=$OUT/file160/r$n; mkdir -p $d
  timeout 120 $MP -n $n hisparse run inputs/bench_spmv_scaling.yaml $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
done
python3 docs/scaling/stop55_x2/phases.py $(ls -tr $OUT/file160/r*/*.h5)
date

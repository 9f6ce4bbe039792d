#!/bin/bash
# session 49, call 5 (x2): the 2-rank split probe without CUDA, with a PyCUDA context, with CuPy too
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d15.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -n 2"
date
for mode in none cuda cupy none cuda cupy; do timeout 60 $M python3 .device/split_probe.py 160 $mode 2>&1 | grep -v compiling; done
date

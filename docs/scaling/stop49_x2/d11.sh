#!/bin/bash
# session 49, call 1 (x2): the whole GPU suite (covers stop 48's host changes 9d31778, 67e17ee, 23de359) + a verified 2-rank SpMV run
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d11.log) 2>&1
date
timeout 60 mpirun -n 2 --bind-to none -x NCCL_NVLS_ENABLE=0 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | tail -3
date
timeout 470 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests 2>&1 | grep -v Warning | tail -15
date

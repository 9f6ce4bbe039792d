#!/bin/bash
# session 51, call 6 (x2): the Cholesky GPU tests and verified 2-rank runs on the final code
# (rank 0 drops A's kept pattern after its own entries: 70d8fd9)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d30.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 200 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_cholesky_subtree.py tests/test_cholesky.py 2>&1 | tail -3 | cut -c1-300
date
for m in lap120 grid2000; do
  timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_${m}_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
done
date

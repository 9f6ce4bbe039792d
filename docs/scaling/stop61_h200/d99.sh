#!/bin/bash
# Stop 61, call 2 (one H200): the whole GPU suite (pytest -m gpu, 8 workers) on this stop's code,
# its first since stop 52's d36; multi-rank GPU tests share the one GPU.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d99.log) 2>&1
date
timeout 560 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider --durations=20 \
  -rfE tests > $OUT/suite_d99.log 2>&1
echo "rc $?"; tail -60 $OUT/suite_d99.log
date

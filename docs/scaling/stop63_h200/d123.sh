#!/bin/bash
# Stop 63, call 8 (one H200): the whole GPU suite on the stop's last GPU code (after the
# MTTKRP's first part moved to its own stream and rows, and background_work took several
# streams: SpMV's graphs use it too).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d123.log) 2>&1
date
timeout 480 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests > $OUT/suite_d123.log 2>&1; tail -3 $OUT/suite_d123.log
grep -E "^(FAILED|ERROR)" $OUT/suite_d123.log | head -30
date

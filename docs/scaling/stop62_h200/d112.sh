#!/bin/bash
# Stop 62, call 8 (one H200): what the SpMV plan's GPU passes pay the first time a process runs
# them (first_use_probe.py), in two fresh processes: the first also compiles CuPy's kernels into
# its disk cache (a fresh machine), the second only loads them, as every run after the first.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d112.log) 2>&1
date
for k in 1 2 3; do echo "== process $k"; timeout 120 python3 docs/scaling/stop62_h200/first_use_probe.py; done
date

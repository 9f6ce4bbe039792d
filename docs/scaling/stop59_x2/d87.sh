#!/bin/bash
# Stop 59, call 6 (2xH200): R-MAT 23's read with and without the thread that loads the
# compiled loops from Numba's cache (read_loader_probe.py; the first run fills the cache).
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d87.log) 2>&1
P=docs/scaling/stop59_x2
date
python3 $P/read_loader_probe.py 23 2 > /dev/null
for k in 1 2; do for l in 0 1 2; do python3 $P/read_loader_probe.py 23 $l; done; done
date

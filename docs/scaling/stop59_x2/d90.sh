#!/bin/bash
# Stop 59, call 9 (2xH200): R-MAT 23's read beside the split's and the renumbering's loader with
# the interpreter switching threads every 5 ms (its default), 1 ms and 0.2 ms.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d90.log) 2>&1
P=docs/scaling/stop59_x2
python3 $P/read_loader_probe.py 23 2 > /dev/null
for k in 1 2; do
  python3 $P/read_loader_probe.py 23 0
  for s in 0.005 0.001 0.0002; do python3 $P/read_loader_probe.py 23 2 $s; done
done

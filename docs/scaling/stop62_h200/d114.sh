#!/bin/bash
# Stop 62, call 10 (one H200): CP-ALS 20M at one GPU, this stop's code, with the graph's
# priorities on and off (gpu.graph_priorities), alternated three times: do the ~14 us a mode
# between the kernels (d106) come from them?
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d114.log) 2>&1
P=docs/scaling/stop55_x2/phases.py
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=5 --quiet"
timeout 100 python3 -m hisparse run $C --set output.dir=$OUT/r_c > /dev/null 2>&1; rm -rf $OUT/r_c
for k in a b c; do
  for p in true false; do
    d=$OUT/r_$k$p; mkdir -p $d
    timeout 100 python3 -m hisparse run $C --set gpu.graph_priorities=$p --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
    echo "== priorities $p $k"; python3 $P $d/*.h5 | grep -E "  total  "
    rm -f $d/*.h5
  done
done
date

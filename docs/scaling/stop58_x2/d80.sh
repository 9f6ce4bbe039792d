#!/bin/bash
# Stop 58, call 7 (2xH200): CP-ALS 20M at 2 GPUs with parallel.connect_early false / true,
# alternating, three of each after one compiling run: does its nonzeros' routing (the first
# NCCL exchange, phase distribute) stop paying NCCL's connections, and at what cost in connect?
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
C=inputs/bench_cpals_nell2_20m.yaml
date
timeout 120 $MP -n 2 hisparse run $C $S --set output.dir=$OUT/warm > /dev/null 2>&1
for k in 1 2 3; do
  for e in false true; do
    d=$OUT/e_$e; mkdir -p $d
    timeout 120 $MP -n 2 hisparse run $C $S --set parallel.connect_early=$e --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
  done
done
python3 - $OUT/e_false/*.h5 $OUT/e_true/*.h5 <<'PY'
import sys, numpy as np
from hisparse.io import read_results
for path in sys.argv[1:]:
    r = read_results(path); a = r["attrs"]; w = r["wall"]; ph = r["phases"]
    one = {p: np.nanmax(w[0, :, ph.index(p)]) for p in ("startup", "connect", "read", "distribute")}
    total = np.nanmedian(np.nanmax(w[:, :, ph.index("total")], axis=1))
    print(f"{path.split('/')[-2]:8s} tts {a['time_to_solution_seconds']:6.3f} s  per repeat {total*1e3:7.3f} ms  "
          + "  ".join(f"{p} {v:6.3f}" for p, v in one.items()))
PY
date

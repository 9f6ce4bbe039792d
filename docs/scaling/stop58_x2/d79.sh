#!/bin/bash
# Stop 58, call 6 (2xH200): every strong series at 1 and 2 GPUs with this stop's code, each
# configuration first run once at one GPU (its compiles), then timed at 1 and 2 GPUs: per-repeat
# total and time to solution (peers and verification off, 5 repeats).
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
date
for c in bench_spmv_scaling bench_spgemm_poisson27_128 bench_spgemm_rmat18 bench_sptv_nell2_multigpu bench_cpals_nell2_20m; do
  for n in 1 1 2; do
    d=$OUT/$c/r$n; mkdir -p $d; rm -f $d/*.h5
    timeout 120 $MP -n $n hisparse run inputs/$c.yaml $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
  done
  python3 - $OUT/$c/r1/*.h5 $OUT/$c/r2/*.h5 <<'PY'
import sys, numpy as np
from hisparse.io import read_results
for path in sys.argv[1:]:
    r = read_results(path); a = r["attrs"]; w = r["wall"]; k = r["phases"].index("total")
    total = np.nanmedian(np.nanmax(w[:, :, k], axis=1))
    print(f"{path.split('/')[-3]:28s} ranks {a['nranks']}  per repeat {total*1e3:8.3f} ms  "
          f"tts {a['time_to_solution_seconds']:6.3f} s  startup {a['startup_seconds']:5.3f} s")
PY
done
date

#!/bin/bash
# Stop 59, call 5 (2xH200): this stop's numbers. (1) rmat_read_probe.py: R-MAT 23's read by its
# steps (rank 0's part at 1 and 2 ranks). (2) Every strong series at 1 and 2 GPUs, this tree,
# one rank per GPU, OMPI_MCA_pml=ob1 (what `hisparse jobs` now exports on one node): each
# configuration once at one GPU (its compiles), then timed at 1 and 2 GPUs; R-MAT 23 and
# Cholesky 7-pt 120^3 the same way. Per-repeat total, time to solution, start-up; phases beside.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d86.log) 2>&1
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0 -x OMPI_MCA_pml=ob1"
P=docs/scaling/stop59_x2
date
python3 $P/rmat_read_probe.py 23 1
python3 $P/rmat_read_probe.py 23 2
date
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
series() {  # name config-and-sets...
  local name=$1; shift
  for n in 1 1 2 1 2; do
    d=$OUT/$name/r$n; mkdir -p $d
    timeout 150 $MP -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
  done
  # the first 1-GPU run compiled: drop it
  rm -f "$(ls -tr $OUT/$name/r1/*.h5 | head -1)"
  python3 - $name $(ls -tr $OUT/$name/r1/*.h5 $OUT/$name/r2/*.h5) <<'PY'
import sys, numpy as np
from hisparse.io import read_results
for path in sys.argv[2:]:
    r = read_results(path); a = r["attrs"]; w = r["wall"]; k = r["phases"].index("total")
    total = np.nanmedian(np.nanmax(w[:, :, k], axis=1))
    print(f"{sys.argv[1]:22s} ranks {a['nranks']}  per repeat {total*1e3:8.3f} ms  "
          f"tts {a['time_to_solution_seconds']:6.3f} s  startup {a['startup_seconds']:5.3f} s  "
          f"setup {a['setup_seconds']:5.3f} s")
PY
  python3 docs/scaling/stop55_x2/phases.py $(ls -tr $OUT/$name/r1/*.h5 $OUT/$name/r2/*.h5) > $OUT/phases_$name.txt 2>&1
  rm -rf $OUT/$name
}
for c in bench_spmv_scaling bench_spgemm_poisson27_128 bench_spgemm_rmat18 bench_sptv_nell2_multigpu bench_cpals_nell2_20m; do
  series $c inputs/$c.yaml
done
series rmat23 inputs/bench_spmv_rmat.yaml --set input.generate.scale=23
series chol120 inputs/bench_cholesky_lap120_multigpu.yaml
date

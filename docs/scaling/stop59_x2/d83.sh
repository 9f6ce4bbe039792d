#!/bin/bash
# Stop 59, call 2 (2xH200): start-up. (1) Probe: CuPy imported on a thread during MPI's start.
# (2) SpTV 77M and SpMV 160^3 at 1 and 2 GPUs, this tree (CUDA context made beside the imports
# on every rank) against fc7ddd8 (/tmp/old), and this tree under Open MPI's ob1 messaging layer
# (OMPI_MCA_pml=ob1): time to solution and the start-up steps, each twice after a compiling run.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop59_x2
mkdir -p /tmp/old && tar -xzf .device/old.tar.gz -C /tmp/old
date
for n in 1 2; do PRINT_ALL=1 $MP -n $n python3 $P/startup_probe.py numpy bgcupy mpi joincupy cuinit ctx hisparse; done
for n in 1 2; do PRINT_ALL=1 $MP -n $n python3 $P/startup_probe.py numpy mpi cupy cuinit ctx hisparse; done
S="--set peers=[] --set run.repeats=5 --set verify.enabled=false --quiet"
one() {  # label ranks tree extra-mpirun-args config...
  local label=$1 n=$2 tree=$3 extra=$4; shift 4
  d=$OUT/r_$label; mkdir -p $d
  PYTHONPATH=$tree${tree:+:}$PYTHONPATH timeout 120 $MP $extra -x PYTHONPATH -n $n python3 -m hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  python3 - $label $d/*.h5 <<'PY'
import sys, numpy as np
from hisparse.io import read_results
r = read_results(sys.argv[2]); a = r["attrs"]; v = r["rank_vars"]
steps = " ".join(f"{k[8:-8]} " + "/".join(f"{x:.2f}" for x in np.atleast_1d(v[k]))
                 for k in sorted(v) if k.startswith("startup_") and k.endswith("_seconds"))
print(f"{sys.argv[1]:18s} tts {a['time_to_solution_seconds']:6.3f}  startup {a['startup_seconds']:5.3f}  setup {a['setup_seconds']:5.3f} | {steps}")
PY
  rm -f $d/*.h5
}
for c in bench_sptv_nell2_multigpu bench_spmv_scaling; do
  echo "== $c"
  one compile 1 "" "" inputs/$c.yaml
  for k in a b; do
    for n in 1 2; do
      one new_r$n$k $n "" "" inputs/$c.yaml
      one old_r$n$k $n /tmp/old "" inputs/$c.yaml
      one ob1_r$n$k $n "" "-x OMPI_MCA_pml=ob1" inputs/$c.yaml
    done
  done
done
date

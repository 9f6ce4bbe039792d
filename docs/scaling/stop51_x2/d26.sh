#!/bin/bash
# session 51, call 2 (x2): A/B probes (SpMV stencil split, Cholesky pattern + supernode cuts, the
# NCCL binding's import); SpMV 160^3 and Cholesky 2000^2 (saved ordering) at 1/2 with phases
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d26.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 60 python3 .device/probe26.py nccl
HISPARSE_HOST_THREADS=16 timeout 120 python3 .device/probe26.py split
timeout 120 python3 .device/probe26.py chol
date
mkdir -p $OUT/o
timeout 60 $M -n 2 hisparse run inputs/bench_spmv_scaling.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v 2>&1 | grep -E " ok | FAIL" | cut -c1-200
D="bash jobs/device_study.sh -o $OUT/s --ranks 1,2 --gpus 2 --set peers=[] --set run.repeats=5 --set verify.enabled=false"
timeout 60 $D --timeout 25 inputs/bench_spmv_scaling.yaml > $OUT/s1.log 2>&1
timeout 120 $D --timeout 45 --id chol_grid2000_saved --set operation.params.ordering_file=$OUT/o/grid2000.h5 inputs/bench_cholesky_grid2000_multigpu.yaml > $OUT/c_grid.log 2>&1
date
timeout 60 $M -n 2 hisparse run inputs/bench_cholesky_grid2000_multigpu.yaml --set 'peers=[]' --set run.repeats=2 --set output.dir=/tmp/v --set operation.params.ordering_file=$OUT/o/grid2000.h5 2>&1 | grep -E " ok | FAIL|rror" | cut -c1-200
hisparse report $OUT/s --no-plots --output $OUT/s > /dev/null 2>&1
cut -c1-220 $OUT/s/report.txt | head -8
hisparse report --setup $OUT/s | cut -c1-250
python3 .device/phases.py $OUT/s/*.h5 2>&1 | grep -v "^    [a-z_]*plan_[a-z_]*count" | head -120
python3 - $OUT/s/chol*.h5 <<'PY'
import sys
from hisparse.io import read_results
for p in sys.argv[1:]:
    a = read_results(p)["attrs"]
    print(p.split("/")[-1][:40], {k[5:-8]: round(float(v), 3) for k, v in sorted(a.items()) if (k.startswith("chol_symbolic_") or k.startswith("chol_ordering_") or k.startswith("chol_analysis_")) and k.endswith("_seconds")})
PY
rm -f $OUT/s/*.h5 $OUT/o/*.h5
date

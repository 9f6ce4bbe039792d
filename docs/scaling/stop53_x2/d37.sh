#!/bin/bash
# session 53, call 2 (x2): the fixed SpMV engine test; the ordering's level-set tolerance A/B
# (0 = stop 52's rule, 0.05 = this stop's) on the 2-D grid 2000^2 and the Laplacian 120^3 at 2
# ranks, verified; then a factor larger than one GPU on two: the plan of 250^3 at 2 ranks
# (ordering saved), and the run of the largest that the plan fits
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d37.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
timeout 120 python3 -m pytest -m gpu -n 4 -q -o addopts="" -p no:cacheprovider tests/test_spmv.py -k simulated 2>&1 | tail -2
mkdir -p $OUT/ab $OUT/o
V="--set peers=[] --set run.repeats=2 --quiet"
for case in grid2000:0 grid2000:0.05 lap120:0 lap120:0.05 grid2000:0 grid2000:0.05; do
  m=${case%:*}; tol=${case#*:}
  d=$OUT/ab/${m}_$tol; mkdir -p $d
  timeout 90 $M -n 2 python3 .device/tol_run.py $tol run inputs/bench_cholesky_${m}_multigpu.yaml $V --set output.dir=$d 2>&1 | grep -E "rror|FAIL" | cut -c1-200
  echo "tol $tol: $(python3 .device/cholsum.py $d/*.h5)"; rm -f $d/*.h5
done
date
timeout 200 python3 jobs/cholesky_plan.py 250,250,250 2 --ordering-file $OUT/o/lap250.h5 2>&1 | tee $OUT/plan250.txt
date
most=$(python3 -c "import re,sys; t=open('$OUT/plan250.txt').read(); v=[float(x) for x in re.findall(r'total ([0-9.]+) GB', t)]; print(int(max(v)) if v else 999)")
echo "largest rank total at 250^3: $most GB"
if [ "$most" -le 115 ]; then N=250; O="--set operation.params.ordering_file=$OUT/o/lap250.h5"; else N=230; O=""; fi
echo "running ${N}^3 on 2 GPUs, $((575 - SECONDS)) s left"
timeout $((575 - SECONDS)) $M -n 2 hisparse run inputs/bench_cholesky_lap120_multigpu.yaml --set peers=[] --set run.repeats=1 --set "input.generate.dims=[$N,$N,$N]" --set run.name=chol_lap${N}_2gpu --set output.dir=$OUT/big $O --set run.progress=true 2>&1 | tail -15 | cut -c1-250
python3 .device/cholsum.py $OUT/big/*.h5
python3 .device/phases.py $OUT/big/*.h5 > $OUT/phases_big.txt 2>&1
rm -f $OUT/o/*.h5
date

#!/bin/bash
# session 55, call 4 (x2): R-MAT edges from the compiled draws (no draw buffer, src/dst apart in
# the page) against stop 54's, one process and two at once; R-MAT 23 runs at 1 and 2 GPUs;
# CP-ALS 20M per kernel at 1 and 2 ranks (ncu)
cd "$(dirname "$0")/.."
exec > >(tee -a $OUT/d55.log) 2>&1
M="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
date
mkdir -p /tmp/oldgen && tar -xzf .device/oldapp.tar.gz -C /tmp/oldgen
python3 .device/rmat_ab.py old 12 > /dev/null 2>&1; python3 .device/rmat_ab.py new 12 > /dev/null 2>&1  # Numba caches
for k in 1 2; do
  for w in old new; do
    timeout 60 python3 .device/rmat_ab.py $w 23
    (timeout 60 python3 .device/rmat_ab.py $w 23 0 & timeout 60 python3 .device/rmat_ab.py $w 23 1; wait)
  done
done
date
S="--set peers=[] --set run.repeats=5 --quiet"
one() {  # label ranks config args...
  local label=$1 n=$2; shift 2
  d=$OUT/r_$label; mkdir -p $d
  timeout 90 $M -n $n hisparse run "$@" $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -20 $OUT/last.log
  echo "== $label"; python3 .device/phases.py $d/*.h5 | grep -E "tts|  (startup|read|plan|upload|total)  "
  rm -f $d/*.h5
}
R="inputs/bench_spmv_rmat.yaml --set input.generate.scale=23"
one rmat23_r1 1 $R
one rmat23_r1b 1 $R --set verify.enabled=false
one rmat23_r2 2 $R
one rmat23_r2b 2 $R --set verify.enabled=false
date
C="inputs/bench_cpals_nell2_20m.yaml --set peers=[] --set run.repeats=1 --set verify.enabled=false --quiet"
timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_cp_r1.csv hisparse run $C --set output.dir=$OUT/n1 > $OUT/ncu1.log 2>&1 || tail -5 $OUT/ncu1.log
timeout 150 $M -n 2 bash -c "ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu_cp_r2_rank\${OMPI_COMM_WORLD_RANK}.csv hisparse run $C --set output.dir=$OUT/n2" > $OUT/ncu2.log 2>&1 || tail -5 $OUT/ncu2.log
python3 .device/ncusum.py $OUT/ncu_cp_r1.csv $OUT/ncu_cp_r2_rank*.csv
rm -rf $OUT/n1 $OUT/n2
date

#!/bin/bash
# Stop 58, call 8 (2xH200): the staged download (host_copy through page-locked pieces, the
# loop PyCUDA's staged_download shares) and the GPUs told apart by bus id: the GPU tests of the
# GPU layer, the renumbering and R-MAT's rows; R-MAT 21 verified at 2 and 1 GPUs; the 27-point
# 160^3 at 2 GPUs with every GPU visible to both ranks and with each rank shown its own alone
# (CUDA_VISIBLE_DEVICES per rank), alternating: start-up, transport, halo GB/s.
cd "$(dirname "$0")/../../.."
MP="mpirun --bind-to none -x NCCL_NVLS_ENABLE=0"
P=docs/scaling/stop55_x2/phases.py
date
timeout 120 python3 -m pytest -m gpu -n 8 -q -o addopts="" -p no:cacheprovider tests/test_gpu_layer.py tests/test_spmv_distributed.py tests/test_generators.py -k "gpu_layer or staged or cupy or renumber or reorder or degree or rmat" > $OUT/suite.log 2>&1
tail -2 $OUT/suite.log | cut -c1-300; grep -E "^(FAILED|ERROR)" $OUT/suite.log | head -20
date
S="--set peers=[] --quiet"
for n in 2 1; do
  d=$OUT/v$n; mkdir -p $d
  timeout 120 $MP -n $n hisparse run inputs/bench_spmv_rmat.yaml $S --set run.repeats=2 --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
  python3 -c "import sys,h5py; a=h5py.File(sys.argv[1]).attrs; print('verify21 r$n', a.get('verify_passed'), a.get('verify_max_rel_error'), 'tts', a.get('time_to_solution_seconds'))" $d/*.h5
done
date
C="inputs/bench_spmv_scaling.yaml --set verify.enabled=false --set run.repeats=5"
for k in 1 2 3; do
  for mode in all own; do
    d=$OUT/c_$mode; mkdir -p $d
    if [ $mode = all ]; then
      timeout 60 $MP -n 2 hisparse run $C $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
    else
      timeout 60 $MP -n 2 bash -c 'export CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK; exec hisparse run "$@"' _ $C $S --set output.dir=$d > $OUT/last.log 2>&1 || tail -5 $OUT/last.log
    fi
  done
done
python3 - $OUT/c_all/*.h5 $OUT/c_own/*.h5 <<'PY'
import sys, numpy as np
from hisparse.io import read_results
for path in sys.argv[1:]:
    r = read_results(path); a = r["attrs"]; w = r["wall"]; ph = r["phases"]; v = r["rank_vars"]
    one = {p: np.nanmax(w[0, :, ph.index(p)]) for p in ("startup", "read", "plan", "upload")}
    total = np.nanmedian(np.nanmax(w[:, :, ph.index("total")], axis=1))
    print(f"{path.split('/')[-2]:6s} {a.get('transport')} tts {a['time_to_solution_seconds']:6.3f}  per repeat {total*1e3:7.3f} ms  "
          + "  ".join(f"{p} {x:5.3f}" for p, x in one.items())
          + f"  device {np.max(v['startup_device_seconds']):5.3f}  halo_gbps {np.min(v['halo_gbps']):6.2f}"
          + f"  gpus {list(np.asarray(v.get('gpu_pci_bus_id', ['?'])))}")
PY
date

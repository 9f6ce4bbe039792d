#!/bin/bash
# Stop 64, call 6 (one H200): SpGEMM 27-pt 128x128x64 ran 41.9 ms a repeat (34.8 GFLOP/s)
# against 128^3's 70.0 ms (42.3) and 128x128x32's 18.8 ms (37.7) in d125: every kernel of one
# repeat by Nsight Compute (durations, grids), at the three sizes.
cd "$(dirname "$0")/../../.."
exec > >(tee $OUT/d129.log) 2>&1
date
for z in 128 64 32; do
  echo "== ncu spgemm 128x128x$z"
  timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,dram__bytes.sum \
    python3 -m hisparse run inputs/bench_spgemm_poisson27_128.yaml --set "input.generate.dims=[128,128,$z]" --set peers=[] --set run.repeats=1 --set run.warmup=0 \
      --set verify.enabled=false --set output.dir=$OUT/r_ncu > $OUT/ncu_spgemm_$z.txt 2>&1
  python3 - $OUT/ncu_spgemm_$z.txt <<'PY'
import re, sys, collections
text = open(sys.argv[1]).read().split("\n")
rows, name = [], None
for line in text:
    m = re.match(r"\s+(\w+)(<.*?>)? \((\d+), 1, 1\)x\((\d+), 1, 1\)", line)
    if m:
        name = (m.group(1), int(m.group(3)), int(m.group(4))); cur = {}
        rows.append((name, cur)); continue
    m = re.match(r"\s+(gpu__time_duration.sum|dram__bytes.sum)\s+(\S+)\s+([\d.,]+)", line)
    if m and rows:
        v = float(m.group(3).replace(",", "")); u = m.group(2)
        v *= {"ns": 1e-3, "us": 1, "ms": 1e3, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3, "byte": 1e-6}.get(u, 1)
        rows[-1][1][m.group(1)] = v
tot = collections.OrderedDict()
for (k, g, b), d in rows:
    t = tot.setdefault(k, [0, 0.0, 0.0, []]); t[0] += 1; t[1] += d.get("gpu__time_duration.sum", 0); t[2] += d.get("dram__bytes.sum", 0); t[3].append(g)
for k, (n, us, mb, grids) in tot.items():
    print(f"  {k:22s} launches {n:4d}  {us:10.1f} us  {mb:9.1f} MB  grids {sorted(set(grids))[:6]}")
print("  sum", round(sum(t[1] for t in tot.values()), 1), "us")
PY
done
rm -rf $OUT/r_ncu
date

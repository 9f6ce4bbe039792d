"""session 53: per-kernel GPU time from `ncu --csv --metrics gpu__time_duration.sum` logs:
the sum and count per kernel name (ms), and the total."""
import csv, sys, collections
scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3, "nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
for path in sys.argv[1:]:
    rows = []
    with open(path) as handle:
        lines = [l for l in handle if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            value = float(row["Metric Value"].replace(",", ""))
            rows.append((row["Kernel Name"].split("(")[0], value * scale[row["Metric Unit"]]))
    sums, counts = collections.defaultdict(float), collections.Counter()
    for name, ms in rows:
        sums[name] += ms; counts[name] += 1
    print(f"== {path}: {len(rows)} kernels, {sum(sums.values()):.3f} ms")
    for name, ms in sorted(sums.items(), key=lambda kv: -kv[1])[:25]:
        print(f"  {name[:60]:60s} {counts[name]:5d} {ms:10.3f} ms")

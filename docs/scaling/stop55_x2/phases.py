"""Print per-rank setup-scope phases (wall), the rank vars of setup steps and selected attrs."""
import sys
import warnings
import numpy as np
from hisparse.io import read_results
warnings.simplefilter("ignore")
KEYS = ("startup_", "plan_", "chol_setup", "read_", "generate", "seconds", "halo_gbps", "peak_host")
for path in sys.argv[1:]:
    r = read_results(path)
    a = r["attrs"]
    print("==", path.split("/")[-1], "nranks", a.get("nranks"), "tts", a.get("time_to_solution_seconds"))
    scopes = r.get("phase_scopes") or {}
    wall = r["wall"]
    for k, p in enumerate(r["phases"]):
        v = wall[:, :, k]
        vals = np.nanmax(v, axis=0) if scopes.get(p) == "setup" else np.nanmedian(v, axis=0)
        if np.all(np.isnan(vals)) or np.nanmax(vals) < 0.005:
            continue
        first = v[0] if scopes.get(p) != "setup" else vals
        if scopes.get(p) == "setup" or scopes.get(p) == "after":
            print(f"  {p:24s} {scopes.get(p,''):7s}", " ".join(f"{x:8.3f}" for x in vals),
                  " first:", " ".join(f"{x:7.3f}" for x in first))
        else:  # per repeat: milliseconds
            print(f"  {p:24s} {scopes.get(p,''):7s}", " ".join(f"{x*1e3:8.3f}ms" for x in vals),
                  " first:", " ".join(f"{x*1e3:7.3f}ms" for x in first))
    for key, value in r["rank_vars"].items():
        if any(s in key for s in KEYS):
            try:
                arr = np.asarray(value, dtype=float)
                if np.nanmax(np.abs(arr)) < 0.01 and "seconds" in key:
                    continue
                print(f"    {key:36s}", " ".join(f"{x:9.4g}" for x in arr))
            except (TypeError, ValueError):
                pass
    for key in sorted(a):
        if any(s in key for s in ("chol_analysis_seconds", "chol_ordering_seconds", "chol_symbolic_seconds",
                                  "chol_distribute", "chol_refine", "chol_library", "chol_compiled",
                                  "setup_seconds", "read_", "generate")):
            print("   ", key, a[key])

"""Per-repeat phases (median over repeats, ms) of results files: wall and GPU (events), per rank;
and CP-ALS's iteration seconds."""
import sys
import warnings
import numpy as np
import h5py
from hisparse.io import read_results
warnings.simplefilter("ignore")
for path in sys.argv[1:]:
    r = read_results(path)
    a = r["attrs"]
    print("==", path.split("/")[-1], "nranks", a.get("nranks"), "tts", a.get("time_to_solution_seconds"))
    scopes = r.get("phase_scopes") or {}
    for k, p in enumerate(r["phases"]):
        if scopes.get(p) == "setup":
            continue
        w = np.nanmedian(r["wall"][:, :, k], axis=0) * 1e3
        g = np.nanmedian(r["gpu"][:, :, k], axis=0) * 1e3
        if np.all(np.isnan(w)) and np.all(np.isnan(g)):
            continue
        print(f"  {p:14s} wall", " ".join(f"{x:8.3f}" for x in w), " gpu", " ".join(f"{x:8.3f}" for x in g))
    with h5py.File(path, "r") as f:
        def show(name, obj):
            if "iteration_seconds" in name and isinstance(obj, h5py.Dataset):
                print("  ", name, np.round(obj[()] * 1e3, 3))
        f.visititems(show)

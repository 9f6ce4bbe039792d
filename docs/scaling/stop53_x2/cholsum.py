"""session 53: one line per Cholesky results file: ranks, time to solution, analysis, ordering
(top split, splits, leaves, level-set splits, speculations kept), flops, nnz(L), numeric, solve,
backward error, peak device bytes per rank."""
import sys, h5py, numpy as np
for path in sys.argv[1:]:
    with h5py.File(path, "r") as f:
        a = f.attrs
        g = lambda k: a.get(k, float("nan"))
        peak = f["perf/peak_device_bytes"][()] if "perf/peak_device_bytes" in f else []
        print(f"{a['name']} r{int(a['nranks'])} n {int(g('chol_n'))} tts {g('time_to_solution_seconds'):.2f} "
              f"setup {g('setup_seconds'):.2f} analysis {g('chol_analysis_seconds'):.2f} ordering "
              f"{g('chol_ordering_seconds'):.2f} (top {g('chol_ordering_top_split_seconds'):.2f} "
              f"splits {g('chol_ordering_splits_seconds'):.2f} leaves {g('chol_ordering_leaves_seconds'):.2f} "
              f"ls {int(g('chol_ordering_level_set_splits'))} kept {int(g('chol_ordering_speculations_kept'))}/"
              f"{int(g('chol_ordering_speculations'))}) symbolic {g('chol_symbolic_seconds'):.2f} "
              f"flops {g('chol_factor_flops'):.4e} nnzL {g('chol_factor_nnz'):.4e} numeric "
              f"{g('chol_numeric_seconds'):.4f} solve {g('chol_solve_seconds'):.4f} distribute "
              f"{g('chol_distribute_seconds'):.2f} upload {g('chol_upload_seconds'):.2f} berr "
              f"{g('verify_max_rel_error'):.1e} ok {bool(g('verify_passed'))} peak GB "
              f"{np.round(np.asarray(peak, dtype=float).ravel() / 1e9, 1).tolist()}", flush=True)

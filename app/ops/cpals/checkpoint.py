"""CP-ALS checkpoints: the ALS state after an iteration, with the fingerprint of the run (input
and parameters) that a resumed run must share."""
import hashlib
import os

import numpy as np

from ...errors import InputError

CHECKPOINT_SCHEMA = "hisparse.cpals_checkpoint"

#: What a checkpoint must share with a run that resumes from it, with the words for a mismatch.
FINGERPRINT = {"shape": "tensor shape", "nnz": "nonzeros", "data_hash": "tensor data hash",
               "rank": "rank", "init": "init", "precision": "precision"}


def run_fingerprint(shape, unfolding, rank, init, precision):
    """The identity of a run's input and of the parameters that shape its iterates.

    The data hash is BLAKE2b over the mode-0 unfolding (row pointers as int64, the other modes'
    coordinates, the values at the run's precision): its nonzeros are in canonical order, so the
    same tensor hashes the same whatever the order of its file.

    Parameters
    ----------
    shape : tuple of int
    unfolding : ModeCSR
        The whole mode-0 unfolding.
    rank : int
    init : str
        How the factors were started (``"random (run.seed 3)"``, ``"nvecs"``, a file spec).
    precision : {"fp64", "fp32"}

    Returns
    -------
    dict
        Keys of :data:`FINGERPRINT`.
    """
    digest = hashlib.blake2b(digest_size=16)
    for array in (np.asarray(unfolding.indptr, dtype=np.int64), unfolding.other_idx,
                  unfolding.values):
        digest.update(np.ascontiguousarray(array))
    return {"shape": tuple(int(s) for s in shape), "nnz": int(unfolding.nnz),
            "data_hash": digest.hexdigest(), "rank": int(rank), "init": str(init),
            "precision": str(precision)}


def write_checkpoint(path, state):
    """Write the ALS state after an iteration (atomic: temporary file, then rename).

    Parameters
    ----------
    state : dict
        ``factors`` (list of (I_m, R) arrays, normalised), ``grams`` (list of (R, R) fp64),
        ``lam`` (R,), ``fits`` (iterations done,), ``fingerprint`` (:func:`run_fingerprint`).
    """
    from ...io import atomic_file
    # The io guard: replaces only a previous checkpoint (its schema attribute), cleans up.
    with atomic_file(path, what="checkpoint", replaces=CHECKPOINT_SCHEMA) as out:
        handle = out.h5()
        handle.attrs["schema"] = CHECKPOINT_SCHEMA
        handle.attrs["iteration"] = len(state["fits"])
        for key, value in state["fingerprint"].items():
            handle.attrs[key] = np.asarray(value, dtype=np.int64) if key == "shape" else value
        handle.create_dataset("fits", data=np.asarray(state["fits"], dtype=np.float64))
        handle.create_dataset("lambda", data=np.asarray(state["lam"], dtype=np.float64))
        for mode, (factor, gram) in enumerate(zip(state["factors"], state["grams"])):
            handle.create_dataset(f"factor_{mode}", data=factor)
            handle.create_dataset(f"gram_{mode}", data=gram)


def read_checkpoint(path, fingerprint, dtype):
    """Read a checkpoint written by :func:`write_checkpoint` for the run of ``fingerprint``.

    Raises
    ------
    InputError
        One line naming ``path``: the file is missing or not HDF5, not a CP-ALS checkpoint, of
        another input or other parameters (saying what differs), or a dataset is missing, of the
        wrong shape or not finite.
    """
    import h5py
    if not os.path.exists(path):
        raise InputError(f"{path}: checkpoint not found (operation.params.resume is true)")
    try:
        with h5py.File(path, "r") as handle:
            if handle.attrs.get("schema") != CHECKPOINT_SCHEMA:
                raise InputError(f"{path}: not a hisparse CP-ALS checkpoint")
            _check_fingerprint(path, handle.attrs, fingerprint)
            return _read_state(path, handle, fingerprint["shape"], fingerprint["rank"], dtype)
    except OSError as exc:
        raise InputError(f"{path}: cannot read checkpoint ({exc})") from None


def _check_fingerprint(path, attrs, wanted):
    missing = [key for key in FINGERPRINT if key not in attrs]
    if missing:
        raise InputError(f"{path}: checkpoint carries no fingerprint of its input "
                         f"({', '.join(missing)} missing: written by an older hisparse?), so it "
                         f"cannot be checked against this run; start without resume")
    saved = {key: attrs[key] for key in FINGERPRINT}
    saved["shape"] = tuple(int(s) for s in np.ravel(saved["shape"]))
    for key in ("nnz", "rank"):
        saved[key] = int(saved[key])
    for key in ("data_hash", "init", "precision"):
        saved[key] = str(saved[key])
    same_layout = all(saved[k] == wanted[k] for k in ("shape", "nnz", "precision"))
    differences = []
    for key, label in FINGERPRINT.items():
        # The hash is compared only where it can be the sole difference (same shape, nonzero
        # count and stored precision of the values).
        if saved[key] != wanted[key] and (key != "data_hash" or same_layout):
            differences.append(f"{label} {saved[key]} in the checkpoint, {wanted[key]} here")
    if differences:
        raise InputError(f"{path}: checkpoint is of another run ({'; '.join(differences)}); "
                         f"resume only with the input and parameters it was written with")


def _read_state(path, handle, shape, rank, dtype):
    """The datasets of a checkpoint, each checked for presence, shape and finite values."""
    order = len(shape)
    expected = {"fits": None, "lambda": (rank,)}
    for mode in range(order):
        expected[f"factor_{mode}"] = (int(shape[mode]), rank)
        expected[f"gram_{mode}"] = (rank, rank)
    arrays = {}
    for name, want in expected.items():
        dataset = handle.get(name)
        if dataset is None or not hasattr(dataset, "shape"):
            raise InputError(f"{path}: checkpoint dataset '{name}' not found")
        if (want is None and len(dataset.shape) != 1) or (want is not None and
                                                           dataset.shape != want):
            raise InputError(f"{path}: checkpoint dataset '{name}' has shape {dataset.shape}, "
                             f"expected {want or '(iterations,)'}")
        array = dataset[()]
        if array.dtype.kind not in "fiu" or not np.isfinite(array).all():
            raise InputError(f"{path}: checkpoint dataset '{name}' does not hold finite numbers")
        arrays[name] = array
    return {"fits": [float(f) for f in arrays["fits"]],
            "lam": arrays["lambda"].astype(np.float64),
            "factors": [arrays[f"factor_{m}"].astype(dtype) for m in range(order)],
            "grams": [arrays[f"gram_{m}"].astype(np.float64) for m in range(order)]}

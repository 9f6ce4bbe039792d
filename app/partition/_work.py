"""Rows balanced by their work (a cost per row, such as SpGEMM's intermediate products), for
inputs where a few rows hold much of it.

The heaviest rows (above ``HEAVY_FACTOR`` x the mean, at most ``MAX_HEAVY`` of them) are dealt
one by one, heaviest first, to the least loaded rank (LPT); the other rows then fill every rank
up to ``total / nparts`` in contiguous runs of rows, cut at chunks of consecutive rows. The
hubs of a power-law graph thus end spread over the ranks instead of wherever their (permuted)
ids put them, and every rank gets the same work.

Everything is computed from integer sums over the ranks' rows, so ranks that each hold some
of the rows (in any layout) find the same owners as one rank holding them all:
:func:`work_owners` takes the two collectives it needs as arguments.
"""
import heapq

import numpy as np

from ._rows import bounds_from_cuts, check_rows

#: strategies that balance a per-row work the operation supplies (not the row lengths)
WORK_STRATEGIES = ("flops_balanced",)
#: a row is heavy (dealt on its own) when its work is above this many times the mean row's
HEAVY_FACTOR = 16
#: at most this many heavy rows (the heaviest) are dealt; the rest are cut with the others
MAX_HEAVY = 4096
#: the light rows are cut at chunks of consecutive rows, at most this many per rank (a chunk is
#: one row on matrices of up to this many rows per rank): the cut's granularity
CHUNKS_PER_PART = 16384


def work_imbalance(per_part):
    """``max / mean`` of the work of every part (1.0 when there is none)."""
    per_part = np.asarray(per_part, dtype=np.float64)
    mean = float(per_part.mean()) if len(per_part) else 0.0
    return float(per_part.max()) / mean if mean > 0 else 1.0


def chunk_count(nrows, nparts):
    """Chunks the rows are cut at: one per row up to ``CHUNKS_PER_PART`` rows per part."""
    return int(min(nrows, CHUNKS_PER_PART * nparts))


def chunk_of(rows, nrows, nchunks):
    """The chunk of each row id: chunks are consecutive, non-empty runs of rows."""
    return (np.asarray(rows, dtype=np.int64) * nchunks) // nrows


def heavy_candidates(rows, work, threshold, limit=MAX_HEAVY):
    """This holder's rows whose work is above ``threshold``, at most the ``limit`` heaviest
    (ties by row id): ``(rows, work)``, int64. The global heaviest are among the union of every
    holder's candidates."""
    rows, work = np.asarray(rows, np.int64), np.asarray(work, np.int64)
    above = np.flatnonzero(work > threshold)
    order = np.lexsort((rows[above], -work[above]))[:limit]
    return rows[above][order], work[above][order]


def deal(work, nparts):
    """Longest processing time first: each item, in the order given (heaviest first), goes to
    the part with the least work so far (the lowest part among equals). Returns ``(owner,
    loads)``, int64."""
    owner = np.empty(len(work), dtype=np.int64)
    heap = [(0, part) for part in range(nparts)]
    for i, w in enumerate(np.asarray(work, dtype=np.int64).tolist()):
        load, part = heapq.heappop(heap)
        owner[i] = part
        heapq.heappush(heap, (load + w, part))
    loads = np.zeros(nparts, dtype=np.int64)
    np.add.at(loads, owner, np.asarray(work, dtype=np.int64))
    return owner, loads


def cut_chunks(chunk_work, loads, nparts):
    """Chunk bounds ``(nparts + 1,)`` that fill every part from ``loads`` (its heavy rows) up to
    an equal share of the whole: the chunks whose midpoint falls below the running target go
    to the parts before it. Parts already above the share get no more than one chunk (every
    part gets at least one: :func:`~hisparse.partition.bounds_from_cuts`)."""
    chunk_work = np.asarray(chunk_work, dtype=np.int64)
    light = float(chunk_work.sum())
    share = (light + float(np.sum(loads))) / nparts
    targets = np.maximum(share - np.asarray(loads, dtype=np.float64), 0.0)
    if targets.sum() > 0:
        targets *= light / targets.sum()
    ends = np.cumsum(chunk_work).astype(np.float64)
    cuts = np.searchsorted(ends - chunk_work / 2.0, np.cumsum(targets)[:-1], side="left")
    return bounds_from_cuts(cuts, len(chunk_work), nparts)


def _sum_local(array):
    return array


def _gather_local(value):
    return [value]


def work_owners(rows, work, nrows, nparts, sum_all=_sum_local, gather_all=_gather_local):
    """The part owning each of ``rows`` when rows are balanced by ``work`` (module docstring).

    Parameters
    ----------
    rows : ndarray of int64
        The global ids of the rows this caller holds (every row held by exactly one caller).
    work : ndarray of int64
        Each row's work, at least 1 (an empty row still costs a little).
    nrows, nparts : int
    sum_all : callable
        ``sum_all(int64 array)``: the elementwise sum over every caller (an all-reduce); the
        identity when one caller holds every row.
    gather_all : callable
        ``gather_all(obj)``: every caller's ``obj``, in caller order (an all-gather).

    Returns
    -------
    owners : ndarray of int64, one per row of ``rows``
    per_part : ndarray of int64, (nparts,)
        The work each part gets.
    heavy : int
        Rows dealt on their own.
    """
    check_rows(nrows, nparts)
    rows, work = np.asarray(rows, np.int64), np.asarray(work, np.int64)
    total = int(sum_all(np.array([work.sum()], dtype=np.int64))[0])
    threshold = HEAVY_FACTOR * total / nrows
    candidates = gather_all(heavy_candidates(rows, work, threshold))
    heavy_rows = np.concatenate([c[0] for c in candidates])
    heavy_work = np.concatenate([c[1] for c in candidates])
    order = np.lexsort((heavy_rows, -heavy_work))[:MAX_HEAVY]
    heavy_rows, heavy_work = heavy_rows[order], heavy_work[order]
    heavy_owner, loads = deal(heavy_work, nparts)
    nchunks = chunk_count(nrows, nparts)
    chunks = chunk_of(rows, nrows, nchunks)
    by_row = np.argsort(heavy_rows)
    at = np.searchsorted(heavy_rows[by_row], rows)
    is_heavy = np.zeros(len(rows), dtype=bool)
    inside = at < len(heavy_rows)
    is_heavy[inside] = heavy_rows[by_row][at[inside]] == rows[inside]
    light = sum_all(np.bincount(chunks[~is_heavy], weights=work[~is_heavy],
                                minlength=nchunks).astype(np.int64))
    bounds = cut_chunks(light, loads, nparts)
    owners = np.searchsorted(bounds, chunks, side="right") - 1
    owners[is_heavy] = heavy_owner[by_row][at[is_heavy]]
    if np.any(sum_all(np.bincount(owners, minlength=nparts).astype(np.int64)) == 0):
        # A part whose chunks hold only rows dealt elsewhere (tiny inputs): cut every row by
        # chunks alone, which gives each part at least one.
        every = sum_all(np.bincount(chunks, weights=work, minlength=nchunks).astype(np.int64))
        owners = np.searchsorted(cut_chunks(every, np.zeros(nparts), nparts), chunks,
                                 side="right") - 1
        heavy_rows = heavy_rows[:0]
    return owners.astype(np.int64), parts_work(owners, work, nparts, sum_all), len(heavy_rows)


def parts_work(owners, work, nparts, sum_all=_sum_local):
    """The work of every part (int64) under ``owners`` (one per row held here)."""
    return sum_all(np.bincount(np.asarray(owners, np.int64), weights=np.asarray(work),
                               minlength=nparts).astype(np.int64))

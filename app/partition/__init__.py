"""Partitioners: how rows of a matrix (or fibers of a tensor) are split over ranks.

Every partitioner returns, for each rank, the global ids it owns; parts are disjoint and cover
everything. The row splits can also be found by ranks that each hold only a slice of the row
pointers (:func:`balance_targets`, :func:`weight_counts`, :func:`bounds_from_cuts`), as the
rank-parallel input does.
"""
from ._rows import (ROW_STRATEGIES, RowPartition, balance_targets, bounds_from_cuts, check_rows,
                    equal_blocks, group_by_owner, group_pairs, nnz_balanced_blocks, owners_of,
                    partition_rows, row_modulo, split_by_owner, weight_counts)
from ._work import (HEAVY_FACTOR, MAX_HEAVY, WORK_STRATEGIES, parts_work, work_imbalance,
                    work_owners)
from ._tensor import (TENSOR_STRATEGIES, best_grid, candidate_counts, grid_candidates,
                      mode_histograms, partition_tensor)

__all__ = ["RowPartition", "ROW_STRATEGIES", "partition_rows", "nnz_balanced_blocks",
           "row_modulo", "equal_blocks", "balance_targets", "weight_counts", "bounds_from_cuts",
           "check_rows", "group_by_owner", "group_pairs", "owners_of", "split_by_owner",
           "TENSOR_STRATEGIES", "best_grid", "candidate_counts", "grid_candidates",
           "mode_histograms", "partition_tensor",
           "WORK_STRATEGIES", "HEAVY_FACTOR", "MAX_HEAVY", "work_owners", "parts_work",
           "work_imbalance"]

"""Partitioners: how rows of a matrix (or fibers of a tensor) are split over ranks.

Every partitioner returns, for each rank, the global ids it owns; parts are disjoint and cover
everything.
"""
from ._rows import (ROW_STRATEGIES, RowPartition, nnz_balanced_blocks, partition_rows,
                    row_modulo)

__all__ = ["RowPartition", "ROW_STRATEGIES", "partition_rows", "nnz_balanced_blocks",
           "row_modulo"]

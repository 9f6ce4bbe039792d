"""Distributed-matrix pieces shared by the row-distributed operations (SpMV today; SpMM, CG or a
triangular solve next): which vector entries each rank owns, the split of a rank's rows into a
local and a ghost block, the ghost columns its halo exchange must fetch, the row order put
back after a renumbering, and the two-dimensional (checkerboard) placement of the entries with
its fold of partial sums."""
from ._row_blocks import (CROSSING_SHARE, DENSE_COLUMN_TABLE, OwnedColumns, entries_by_key,
                          ghost_columns, local_positions, locate_entries, merge_blocks,
                          renumber_columns, restore_rows, split_blocks, split_column_ranges,
                          split_rows, start_loading_split_loops, x_owners)
from ._checkerboard import Checkerboard, fold_block, processor_grid

__all__ = ["OwnedColumns", "x_owners", "local_positions", "locate_entries", "ghost_columns",
           "split_blocks", "split_rows", "start_loading_split_loops", "split_column_ranges",
           "entries_by_key", "restore_rows", "renumber_columns", "merge_blocks",
           "DENSE_COLUMN_TABLE", "CROSSING_SHARE", "Checkerboard", "fold_block", "processor_grid"]

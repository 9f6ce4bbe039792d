"""Input layouts: how a run's input is read and spread over the ranks (PETSc's ``PetscLayout``,
Devito's ``Distributor``). An operation declares its layout (``Operation.layout()``); the driver
calls ``layout.load(ctx, op)`` in its ``read`` phase, the operation's ``distribute`` calls
``layout.distribute(op, problem)``, and rank 0 records ``layout.describe(problem)``.

- :class:`WholeOnRoot`: the whole input on rank 0, split there by the operation's
  ``partition`` and scattered (the default);
- :class:`WholeOnEveryRank`: the whole input on every rank (each its own copy);
- :class:`RowLayout`: rows by a strategy, every rank reading or generating only its own rows;
- :class:`TensorGridLayout`: a tensor read by slices and cut by the grid partition of a mode;
- :class:`TensorSliceLayout`: a tensor read by slices and moved by the operation's own
  partition (CP-ALS).

The collective pieces (the row split, the grid cut, the routing of nonzeros) live here; the
file-level hyperslab readers they call are :mod:`hisparse.io`'s.
"""
from ._base import (Layout, PartProblem, WholeOnEveryRank, WholeOnRoot, check_cast,
                    check_input_kind, input_label, layout_of, read_problem, run_value_dtype)
from ._rows import (KEEP_WHOLE_MIN_NNZ, RowLayout, RowPart, RowProblem, cast_row_part,
                    generate_row_part, keeps_whole, move_rows_to_owners, read_row_part, read_rows,
                    redistribute_rows, sampled_reach, share_of,
                    replicated_matrix)
from ._tensor import (TensorGridLayout, TensorProblem, TensorSlice, TensorSliceLayout,
                      generate_tensor_slice, merge_duplicates, plan_tensor_grid,
                      read_tensor_parts, read_tensor_slice, route_nonzeros)

__all__ = ["Layout", "WholeOnRoot", "WholeOnEveryRank", "RowLayout", "TensorGridLayout",
           "TensorSliceLayout", "layout_of", "PartProblem", "RowPart", "RowProblem", "TensorSlice", "TensorProblem",
           "read_problem", "read_rows", "read_tensor_parts", "check_input_kind", "input_label",
           "run_value_dtype", "check_cast", "cast_row_part", "keeps_whole", "KEEP_WHOLE_MIN_NNZ",
           "read_row_part", "generate_row_part", "redistribute_rows", "move_rows_to_owners",
           "replicated_matrix",
           "share_of", "sampled_reach",
           "read_tensor_slice", "generate_tensor_slice", "plan_tensor_grid", "route_nonzeros",
           "merge_duplicates"]

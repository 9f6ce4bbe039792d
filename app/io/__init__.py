"""Reading and writing files: the HDF5 input schema, converters from common text formats, the
results file, and the rank-parallel input of row-partitioned matrices (each rank reads or
generates only its rows), and of COO tensors under the grid partition (each rank reads or
generates a slice of the nonzeros, which move to their owners in one all-to-all)."""
from ._hdf5 import (check_output_group, describe, hdf5_reference_check, input_kind, open_member,
                    read_matrix, read_tensor, split_hdf5_reference, write_matrix, write_tensor)
from ._results import (CHECKSUM_LIMIT, input_identity, missing_result_parts, part_file_paths,
                       plan_results_file, plan_written_file, read_results, row_placement,
                       write_result_part, write_results)
from ._atomic import atomic_file, check_output_path, output_problem, probe_directory
from ._convert import CONVERTERS, ONE_TRIANGLE_NOTE, convert, one_triangle
from ._parts import (RowPart, RowProblem, cast_row_part, check_cast, generate_row_part,
                     read_row_part, redistribute_rows)
from ._tensor_parts import (TensorProblem, TensorSlice, generate_tensor_slice, merge_duplicates,
                            plan_tensor_grid, read_tensor_slice, route_nonzeros)

__all__ = ["read_matrix", "read_tensor", "write_matrix", "write_tensor", "input_kind", "describe",
           "read_results", "missing_result_parts", "input_identity", "CHECKSUM_LIMIT",
           "write_results", "convert", "CONVERTERS", "one_triangle", "ONE_TRIANGLE_NOTE",
           "hdf5_reference_check", "open_member",
           "split_hdf5_reference", "plan_results_file", "plan_written_file", "atomic_file",
           "check_output_path", "output_problem", "probe_directory",
           "check_output_group", "RowPart", "RowProblem", "read_row_part", "generate_row_part",
           "redistribute_rows", "cast_row_part", "check_cast", "part_file_paths",
           "write_result_part", "row_placement", "TensorProblem", "TensorSlice",
           "read_tensor_slice", "generate_tensor_slice", "plan_tensor_grid", "route_nonzeros",
           "merge_duplicates"]

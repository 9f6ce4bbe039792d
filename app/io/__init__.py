"""Reading and writing files: the HDF5 input schema, part of an input group by hyperslab (some
rows of a matrix, a range of a tensor's nonzeros), converters from common text formats, and the
results file. Plain file I/O: which rank reads what is :mod:`hisparse.layout`'s."""
from ._hdf5 import (check_output_group, describe, hdf5_reference_check, input_kind, open_member,
                    read_matrix, read_tensor, split_hdf5_reference, write_matrix, write_tensor)
from ._results import (CHECKSUM_LIMIT, input_identity, missing_result_parts, part_file_paths,
                       plan_results_file, plan_written_file, read_results, row_placement,
                       write_result_part, write_results)
from ._atomic import atomic_file, check_output_path, output_problem, probe_directory
from ._convert import CONVERTERS, ONE_TRIANGLE_NOTE, convert, one_triangle
from ._hyperslab import (CooGroup, CsrGroup, indptr_chunks, open_coo_group, open_csr_group,
                         read_coo_range, read_csr_rows, row_extents, sample_row_columns)

__all__ = ["read_matrix", "read_tensor", "write_matrix", "write_tensor", "input_kind", "describe",
           "read_results", "missing_result_parts", "input_identity", "CHECKSUM_LIMIT",
           "write_results", "convert", "CONVERTERS", "one_triangle", "ONE_TRIANGLE_NOTE",
           "hdf5_reference_check", "open_member",
           "split_hdf5_reference", "plan_results_file", "plan_written_file", "atomic_file",
           "check_output_path", "output_problem", "probe_directory",
           "check_output_group", "part_file_paths", "write_result_part", "row_placement",
           "CsrGroup", "open_csr_group", "indptr_chunks", "row_extents", "read_csr_rows",
           "sample_row_columns",
           "CooGroup", "open_coo_group", "read_coo_range"]

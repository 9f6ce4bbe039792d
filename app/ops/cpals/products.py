"""What the ranks reduce in CP-ALS: the column products of a mode's solve (U^T U, <U, M>, the
column maxima of |U|, laid out in one array) and ||X|| from the ranks' sums of squares; and how
many iterations' fits an engine keeps before the operation reads them."""
import math

import numpy as np

from ...arrays import host_array

#: Fit slots of an engine (a ring, indexed by iteration): the most iterations the operation
#: enqueues before it waits and reads their fits, so that ``max_iters: 1e14`` allocates 64.
FIT_SLOTS = 64


def product_width(rank):
    """Entries of one rank's column products: U^T U (R*R), <U, M> (1), column maxima (R)."""
    return rank * rank + 1 + rank


def reduction_parts(total, rank):
    """``(sums, maxima)``: views of a column-products array, what the ranks reduce: U^T U and
    <U, M> (R*R + 1, summed), then the column maxima of |U| (R, maximised)."""
    return total[:rank * rank + 1], total[rank * rank + 1:]


def split_products(total, rank):
    """``(U^T U (R x R), <U, M>, column maxima (R,))`` of a column-products array (views of
    ``total`` but for the float)."""
    r2 = rank * rank
    return total[:r2].reshape(rank, rank), float(total[r2]), total[r2 + 1:]


def squares_sum(values):
    """Sum of the squares of one rank's mode-0 block values (fp64). The squares are made where
    the values are (NumPy or CuPy: correctly rounded products, the same bits) and added on the
    host by NumPy's pairwise sum, as the rank-0 path adds them, so ||X|| keeps its bits (a
    device reduction would add in another order)."""
    wide = values.astype(np.float64)
    return float(np.sum(host_array(wide * wide)))


def norm_from_blocks(sums):
    """||X|| from :func:`squares_sum` of every rank's mode-0 block, in rank order.

    The rank-0 path and the ranks' own blocks give the same bits: each sum is over the same
    array, and the sums are added exactly (``math.fsum``), not in an all-reduce's order.
    """
    return float(np.sqrt(math.fsum(sums)))

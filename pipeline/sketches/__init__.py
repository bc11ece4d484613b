"""Data-independent random sketch operators, regenerable tile by tile.

Problem. A one-pass sketch of ``A`` (n_rows, n_cols) needs random matrices such as
``Phi`` (n_cols, t) and ``S`` (v, n_rows) whose blocks can be produced on whichever
worker holds the matching chunk of ``A``, identically on every retry, for any Zarr
chunking and any number of workers, without ever shipping a random block.

Solution [Upa18 spec, section 5.4]. Every operator is an array ``G`` of shape
(data-axis length, d), either with i.i.d. N(0, 1/d) entries ("JL-normalised",
:mod:`~pipeline.sketches.gaussian`; the only kind a private release uses) or a sparse
sign map with a few +-1/sqrt(zeta) entries per row (:mod:`~pipeline.sketches.sparse`;
the fast default co-range operator of non-private runs). Its rows are cut into fixed
*tiles* of ``tile_size`` consecutive data indices; tile ``g`` is drawn from
``Philox(SeedSequence(root, spawn_key=(code, g)))``. A block of rows is the
concatenation of the tiles it overlaps, sliced. The tile grid, not the storage
chunking, defines the operator.

References
----------
.. [Upa18] J. Upadhyay, "The price of privacy for low-rank factorization", NeurIPS 2018
   (arXiv:1612.04740); as corrected by the project specification sketch-lrf.md.
.. [NumPy] numpy.org/doc/stable/reference/random/parallel.html (SeedSequence spawning).
"""

from pipeline.sketches.gaussian import (
    GaussianOperator,
    OperatorCode,
    operator_block,
    operator_rows,
    operator_tile,
)
from pipeline.sketches.operators import SketchOperator, make_operator
from pipeline.sketches.sparse import SparseSignOperator

__all__ = [
    "GaussianOperator",
    "OperatorCode",
    "SketchOperator",
    "SparseSignOperator",
    "make_operator",
    "operator_block",
    "operator_rows",
    "operator_tile",
]

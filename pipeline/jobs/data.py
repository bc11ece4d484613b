"""The stores the faces open, read and write, as the faces' one entry to them.

The faces (:mod:`pipeline.api`, :mod:`pipeline.estimators`, :mod:`pipeline.cli`)
import the release layer only; this module is the part of their API that is about
stores rather than releases, re-exported deliberately from :mod:`pipeline.io`:

* opening an input from its metadata: :func:`open_input`;
* reading what was published: :func:`open_published`, :func:`is_stream_state`,
  :class:`StreamStore` (a stream's state) and :class:`StateLockedError` (another
  run holds a stream's lock);
* converting the COO Parquet files of a stream batch into a CSR store, out of
  core: :func:`coo_to_csr`;
* writing synthetic data with a known spectrum: :func:`generate_store`,
  :func:`generate_sparse_store`, :func:`generate_pca_store`, :func:`generate_batch`,
  and :func:`synthetic_truth` (the spectrum a synthetic store was built with).

Importing it imports zarr; the faces import it where they use it.
"""

from __future__ import annotations

from pipeline.io.batches import generate_batch
from pipeline.io.coo import coo_to_csr
from pipeline.io.inputs import open_input
from pipeline.io.release import open_published
from pipeline.io.stream_state import StateLockedError, StreamStore, is_stream_state
from pipeline.io.synthetic import (
    generate_pca_store,
    generate_sparse_store,
    generate_store,
    synthetic_truth,
)

__all__ = [
    "StateLockedError",
    "StreamStore",
    "coo_to_csr",
    "generate_batch",
    "generate_pca_store",
    "generate_sparse_store",
    "generate_store",
    "is_stream_state",
    "open_input",
    "open_published",
    "synthetic_truth",
]

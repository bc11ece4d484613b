"""Reading input stores and writing releases (the only importer of zarr).

Problem. Open a chunked Zarr matrix as a lazy dask array after checking, from
metadata alone, that it is a real, numeric, two-dimensional array; and publish a
release (``U``, ``S``, ``V`` and the report) so that a reader never sees a partial
release that looks complete: everything is written under a temporary name in the
destination's directory and renamed into place in one step.
"""

from pipeline.io.inputs import InputInfo, open_input
from pipeline.io.journal import (
    FileJournal,
    PendingJournal,
    default_journal_path,
    input_fingerprint,
)
from pipeline.io.release import (
    check_output_path,
    read_group,
    read_release,
    write_group,
    write_release,
)
from pipeline.io.synthetic import generate_pca_store, generate_store

__all__ = [
    "FileJournal",
    "InputInfo",
    "PendingJournal",
    "check_output_path",
    "default_journal_path",
    "generate_pca_store",
    "generate_store",
    "input_fingerprint",
    "open_input",
    "read_group",
    "read_release",
    "write_group",
    "write_release",
]

"""Reading input stores and writing releases (the only importer of zarr).

Problem. Open a chunked Zarr matrix as a lazy dask array after checking, from
metadata alone, that it is a real, numeric, two-dimensional array; and publish a
release (``U``, ``S``, ``V`` and the report) so that a reader never sees a partial
release that looks complete: everything is written under a temporary name in the
destination's directory and renamed into place in one step.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.io.batches import generate_batch
    from pipeline.io.inputs import InputInfo, open_input
    from pipeline.io.journal import (
        FileJournal,
        PendingJournal,
        default_journal_path,
        input_fingerprint,
    )
    from pipeline.io.release import (
        check_output_path,
        open_published,
        read_group,
        read_release,
        write_group,
        write_release,
    )
    from pipeline.io.stream_state import StreamStore, is_stream_state
    from pipeline.io.synthetic import (
        generate_pca_store,
        generate_sparse_store,
        generate_store,
        synthetic_truth,
    )

#: Where each public name lives. The modules are imported on first use, so a
#: command that needs one of them (``dplr stream``: the state store) does not
#: import dask.array and the others with it.
_HOME = {
    "InputInfo": "inputs",
    "open_input": "inputs",
    "FileJournal": "journal",
    "PendingJournal": "journal",
    "default_journal_path": "journal",
    "input_fingerprint": "journal",
    "check_output_path": "release",
    "open_published": "release",
    "read_group": "release",
    "read_release": "release",
    "write_group": "release",
    "write_release": "release",
    "generate_pca_store": "synthetic",
    "generate_sparse_store": "synthetic",
    "generate_store": "synthetic",
    "synthetic_truth": "synthetic",
    "StreamStore": "stream_state",
    "is_stream_state": "stream_state",
    "generate_batch": "batches",
}


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"pipeline.io.{_HOME[name]}"), name)
    raise AttributeError(f"module 'pipeline.io' has no attribute {name!r}")


__all__ = [
    "FileJournal",
    "InputInfo",
    "PendingJournal",
    "StreamStore",
    "check_output_path",
    "default_journal_path",
    "generate_batch",
    "generate_pca_store",
    "generate_sparse_store",
    "generate_store",
    "input_fingerprint",
    "is_stream_state",
    "open_input",
    "open_published",
    "read_group",
    "read_release",
    "synthetic_truth",
    "write_group",
    "write_release",
]

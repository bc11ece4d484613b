"""Opening the Zarr node (an array or a group) at a local path or an object-store URL.

One path for every input: dense arrays (:mod:`pipeline.io.inputs`) and CSR groups
(:mod:`pipeline.io.csr`) are opened here, so a local path and an ``s3://`` URL are
checked and refused the same way, in one line, before anything is read.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import zarr

from pipeline.errors import StoreLayoutError
from pipeline.io import objectstore

__all__ = ["open_node"]


def open_node(path: str, what: str = "input store") -> zarr.Array[Any] | zarr.Group:
    """The Zarr array or group at ``path`` (a local path or an ``s3://`` URL), read-only.

    Parameters
    ----------
    path : str
        Local path or object-store URL of the node.
    what : str
        How messages name it, e.g. ``"input store"``.

    Returns
    -------
    zarr.Array or zarr.Group

    Raises
    ------
    StoreLayoutError
        The node does not exist or is not a readable Zarr store (one line; the URL
        is redacted).
    """
    store: Any = path
    shown = objectstore.redact(path)
    if objectstore.is_url(path):
        if not objectstore.url_exists(path, what=what):
            raise StoreLayoutError(f"{what} {shown!r} does not exist.")
        store = objectstore.open_store(path, read_only=True, what=what)
    elif not os.path.exists(objectstore.location(path)):  # refuses other schemes
        raise StoreLayoutError(f"{what} {shown!r} does not exist.")
    # zarr warns (with a source line on stderr) about stray entries, e.g. chunk
    # directories under a group; the refusal the caller raises is the one line
    # a user sees
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return zarr.open(store=store, mode="r")
        except Exception as exc:  # noqa: BLE001 - zarr raises many types for a non-store
            raise StoreLayoutError(
                f"{shown!r} is not a readable Zarr store ({type(exc).__name__})."
            ) from None

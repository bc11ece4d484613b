"""Where a release's stores live, as the faces see it: the path helpers of the faces' API.

Re-exported deliberately from :mod:`pipeline.io.objectstore` so that the faces
(:mod:`pipeline.api`, :mod:`pipeline.estimators`, :mod:`pipeline.cli`) reach them
through the release layer: :func:`redact` (a location with any credentials in it
removed, for messages) and :func:`local_path` (a local path as a plain path, an
object-store URL unchanged). Light: importing it imports no numpy or zarr.
"""

from __future__ import annotations

from pipeline.io.objectstore import local_path, redact

__all__ = ["local_path", "redact"]

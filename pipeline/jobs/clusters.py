"""The Dask clusters a release runs on, as the faces' one entry to them.

Re-exported deliberately from :mod:`pipeline.execution` so that the faces
(:mod:`pipeline.api`, :mod:`pipeline.estimators`, :mod:`pipeline.cli`) reach them
through the release layer: :class:`ClusterConfig` (a cluster file, validated),
:func:`load_cluster_config` (a file or installed name to a :class:`ClusterConfig`,
checked before anything starts) and :func:`cluster_client` (a client on a
scheduler address, a cluster file or a local cluster). Importing it imports
distributed; the faces import it where they use it.
"""

from __future__ import annotations

from pipeline.execution import cluster_client
from pipeline.execution.clusters import ClusterConfig, load_cluster_config

__all__ = ["ClusterConfig", "cluster_client", "load_cluster_config"]

"""Wiring of the core algorithms onto Dask (the only importer of dask/distributed).

Problem. Evaluate the one-pass sketches of a chunked matrix where its chunks live:
one task per chunk computes every partial sketch of that chunk (the random blocks
are generated inside the task from their keys, never shipped), a fixed-shape tree
of additions reduces them, and the tall results stay on the cluster. The noise,
the calibration and all the mathematics live in the core; this package only
builds graphs, runs them, counts passes and shows progress.
"""

from pipeline.execution.client import ClusterInfo, cluster_client
from pipeline.execution.source import DaskSource

__all__ = ["ClusterInfo", "DaskSource", "cluster_client"]

"""The canonical tile grid of keyed random matrices.

Sketch operators (:mod:`pipeline.sketches`) and the secret noise
(:mod:`pipeline.mechanisms.noise`) are generated tile by tile along the data
axis, each tile from its own key, so that any block of rows is regenerated
identically on any worker, for any storage chunking.
"""

#: Rows per generation tile along the data axis; recorded in every report because
#: changing it changes the operator [Upa18 spec, section 9, item 20].
DEFAULT_TILE_SIZE = 1024

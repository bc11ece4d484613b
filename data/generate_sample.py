"""Regenerate the committed sample stores ``data/sample.zarr`` and ``data/pca_sample.zarr``.

``sample.zarr``: a 400 x 60 float32 matrix with a geometric spectrum (decay 0.7),
every row norm <= 1, in 100 x 30 chunks (so row clipping crosses column chunks),
seed 20261129.

``pca_sample.zarr``: a 2048 x 16 float32 PCA test matrix (``--kind pca-coherent``),
rank 2, perfectly incoherent (support = all 2048 rows, coherence 1/sqrt(2048)),
``sigma_1^2 = 120``, ``sigma_2^2 = 100``, ``sigma_3^2 = ... = 25`` (eigengap 75,
kappa_k 0.75), every row norm <= 1, in 512 x 8 chunks, seed 20261129. Its true top-2
right singular vectors are in ``attrs["dplr_synthetic"]["top_right_singular_vectors"]``.

Run from the repository root: ``python data/generate_sample.py``.
"""

from __future__ import annotations

import pathlib

from pipeline.io import generate_pca_store, generate_store

HERE = pathlib.Path(__file__).resolve().parent
SEED = 20261129

if __name__ == "__main__":
    meta = generate_store(
        HERE / "sample.zarr",
        400,
        60,
        spectrum="geometric",
        decay=0.7,
        chunks=(100, 30),
        dtype="float32",
        seed=SEED,
        overwrite=True,
    )
    print(
        f"wrote {HERE / 'sample.zarr'}: rank {meta['rank']}, "
        f"sigma_1 = {meta['singular_values'][0]:.4f}"
    )
    meta = generate_pca_store(
        HERE / "pca_sample.zarr",
        2048,
        16,
        2,
        support=2048,
        top=100.0,
        bottom=25.0,
        chunks=(512, 8),
        dtype="float32",
        seed=SEED,
        overwrite=True,
    )
    print(
        f"wrote {HERE / 'pca_sample.zarr'}: rank {meta['rank']}, "
        f"coherence {meta['coherence']:.4g}, gap_k {meta['gap_k']:g}, "
        f"max row norm {meta['max_row_norm']:.4f}"
    )

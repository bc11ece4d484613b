"""Regenerate the committed sample store ``data/sample.zarr``.

A 400 x 60 float32 matrix with a geometric spectrum (decay 0.7), every row norm
<= 1, in 100 x 30 chunks (so row clipping crosses column chunks), seed 20261129.
Run from the repository root: ``python data/generate_sample.py``.
"""

from __future__ import annotations

import pathlib

from pipeline.io import generate_store

HERE = pathlib.Path(__file__).resolve().parent

if __name__ == "__main__":
    meta = generate_store(
        HERE / "sample.zarr", 400, 60, spectrum="geometric", decay=0.7,
        chunks=(100, 30), dtype="float32", seed=20261129, overwrite=True,
    )
    print(f"wrote {HERE / 'sample.zarr'}: rank {meta['rank']}, sigma_1 = {meta['singular_values'][0]:.4f}")

"""Writing synthetic matrices with a known spectrum to Zarr (``dplr generate``)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla
import zarr

from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.linalg.synthetic import (
    cholesky_factor,
    make_spectrum,
    orthonormal_columns,
)

#: Above this many entries the left factor is built block by block (CholeskyQR).
IN_MEMORY_LIMIT = 2.5e7


def generate_store(
    path: str | os.PathLike[str],
    n_rows: int,
    n_cols: int,
    *,
    spectrum: str = "geometric",
    decay: float = 0.9,
    head: int = 10,
    head_value: float = 10.0,
    max_rank: int = 1024,
    max_row_norm: float = 1.0,
    chunks: tuple[int, int] = (10_000, -1),
    dtype: str = "float32",
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Write ``A = c U diag(sigma) V^T`` (n_rows, n_cols) to a new Zarr v3 array.

    ``U`` and ``V`` have orthonormal columns (Haar-like), ``sigma`` comes from
    :func:`~pipeline.linalg.synthetic.make_spectrum` with ``r = min(n_rows,
    n_cols, max_rank)`` terms, and ``c`` scales the matrix so that its largest row
    norm is ``max_row_norm`` (the largest row norm must be <= the clip norm for
    clipping to leave the spectrum intact). The exact singular values ``c sigma``
    are stored in ``attrs["dplr_synthetic"]``. Rows are written block by block,
    so ``n_rows`` is bounded by disk, not memory.

    Returns
    -------
    dict
        The metadata written to the attributes.
    """
    path = os.fspath(path)
    m, n = int(n_rows), int(n_cols)
    if m < 1 or n < 1:
        raise InvalidParameterError(
            f"n_rows and n_cols must be >= 1, got shape ({m}, {n})."
        )
    if os.path.lexists(path) and not overwrite:
        raise StoreLayoutError(
            f"{path!r} already exists; pass --overwrite to replace it."
        )
    r = min(m, n, int(max_rank))
    sigma = make_spectrum(
        r, kind=spectrum, decay=decay, head=head, head_value=head_value
    )
    cr = m if chunks[0] == -1 else min(int(chunks[0]), m)
    cc = n if chunks[1] == -1 else min(int(chunks[1]), n)
    rng_v = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(0,)))
    )
    V = orthonormal_columns(n, r, rng_v)

    def gauss_block(b: int) -> np.ndarray:
        g = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1, b)))
        )
        return g.standard_normal((min(cr, m - b * cr), r))

    nblocks = -(-m // cr)
    if m * r <= IN_MEMORY_LIMIT:
        G = np.vstack([gauss_block(b) for b in range(nblocks)])
        U_full = orthonormal_columns_from(G)

        def u_block(b: int) -> np.ndarray:
            return U_full[b * cr : (b + 1) * cr]
    else:
        gram = np.zeros((r, r))
        for b in range(nblocks):
            g = gauss_block(b)
            gram += g.T @ g
        R = cholesky_factor(gram)

        def u_block(b: int) -> np.ndarray:
            # U = G R^{-1}: orthonormal columns (well conditioned: m >> r) [CholeskyQR]
            return sla.solve_triangular(R, gauss_block(b).T, trans="T", lower=False).T  # type: ignore[no-any-return]

    row_max = max(
        float(np.sqrt(((u_block(b) * sigma) ** 2).sum(axis=1)).max())
        for b in range(nblocks)
    )
    scale = float(max_row_norm) / row_max
    parent, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    meta = {
        "spectrum": spectrum,
        "decay": decay,
        "head": head,
        "head_value": head_value,
        "rank": r,
        "scale": scale,
        "max_row_norm": max_row_norm,
        "seed": seed,
        "singular_values": (scale * sigma).tolist(),
    }
    try:
        z = zarr.create_array(
            store=tmp, shape=(m, n), dtype=dtype, chunks=(cr, cc), zarr_format=3
        )
        for b in range(nblocks):
            block = (u_block(b) * (scale * sigma)) @ V.T
            z[b * cr : b * cr + block.shape[0]] = block.astype(dtype)
            if progress is not None:
                progress(b + 1, nblocks)
        z.attrs["dplr_synthetic"] = meta
        if os.path.lexists(path):
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return meta


def orthonormal_columns_from(G: np.ndarray) -> np.ndarray:
    Q, R = np.linalg.qr(G)
    return Q * np.sign(np.diag(R))  # type: ignore[no-any-return]

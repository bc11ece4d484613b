"""Writing synthetic matrices with a known spectrum to Zarr (``dplr generate``).

Two kinds: :func:`generate_store` (``--kind lowrank``), a Haar low-rank matrix with
a prescribed decay, written block by block; and :func:`generate_pca_store`
(``--kind pca-coherent``), PCA test data with a chosen coherence and eigengap
[spec power-pca, App. B], built in memory. Both record the exact ground truth in
``attrs["dplr_synthetic"]`` and publish the store by one rename.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp
import zarr

from pipeline._validation import check_int_in_range
from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.io import objectstore
from pipeline.io.csr import write_csr
from pipeline.io.objectstore import local_path
from pipeline.linalg.synthetic import (
    cholesky_factor,
    coherent_matrix,
    make_spectrum,
    orthonormal_columns,
)

#: Above this many entries the left factor is built block by block (CholeskyQR).
IN_MEMORY_LIMIT = 2.5e7

#: Largest ``n_rows * n_cols`` of :func:`generate_pca_store` (2^20 x 64), which
#: builds the whole matrix in float64 memory: about 2 GB at peak.
PCA_MAX_ENTRIES = 2**26


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
    u_block = _left_factor(m, r, cr, seed)
    nblocks = -(-m // cr)
    row_max = max(
        float(np.sqrt(((u_block(b) * sigma) ** 2).sum(axis=1)).max())
        for b in range(nblocks)
    )
    scale = float(max_row_norm) / row_max
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

    def row_block(b: int) -> np.ndarray:
        block: np.ndarray = ((u_block(b) * (scale * sigma)) @ V.T).astype(dtype)
        return block

    _publish(path, (m, n), np.dtype(dtype), (cr, cc), row_block, meta, progress)
    return meta


def generate_pca_store(
    path: str | os.PathLike[str],
    n_rows: int,
    n_cols: int,
    rank: int,
    *,
    support: int,
    top: float,
    bottom: float,
    head_ratio: float = 1.2,
    chunks: tuple[int, int] = (10_000, -1),
    dtype: str = "float32",
    seed: int = 0,
    overwrite: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Write PCA test data with known coherence and eigengap to a new Zarr v3 array.

    The matrix is :func:`~pipeline.linalg.synthetic.coherent_matrix` ``(n_rows,
    n_cols, rank, support=support, top=top, bottom=bottom, head_ratio=head_ratio,
    rng=seed)``: an exact SVD whose top-``rank`` left singular vectors live on
    ``support`` rows (coherence ``1/sqrt(support)``), with ``sigma_k^2 = top`` and
    ``sigma_{k+1}^2 = ... = bottom``, and every row norm <= 1 after the cast to
    ``dtype``.

    Parameters
    ----------
    path : str or PathLike
        Where the array is published (atomically, by one rename).
    n_rows, n_cols, rank, support, top, bottom, head_ratio
        As in :func:`~pipeline.linalg.synthetic.coherent_matrix`;
        ``n_rows * n_cols <= PCA_MAX_ENTRIES`` (2^26: the matrix is built in memory).
    chunks : (int, int)
        Chunk shape; -1 spans the axis.
    dtype : {"float32", "float64"}
        Stored dtype; the ground truth is the float64 matrix before the cast.
    seed : int
        Seeds all randomness (``np.random.default_rng(seed)``).
    overwrite : bool
        Replace an existing store at ``path``.
    progress : callable(done, total), optional
        Called after each row block is written.

    Returns
    -------
    dict
        The metadata written to ``attrs["dplr_synthetic"]``: the parameters,
        ``singular_values`` (n_cols,), ``top_right_singular_vectors`` (n_cols, rank)
        as nested lists (the PCA ground truth ``V_k``), and the public facts
        ``coherence``, ``row_coherence``, ``gap_k``, ``kappa_k``, ``max_row_norm``.

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range, the matrix is too large to build in
        memory, or a row would have norm > 1.
    StoreLayoutError
        If ``path`` exists and ``overwrite`` is false.
    """
    path = os.fspath(path)
    n_rows = check_int_in_range(n_rows, "n_rows", 2)
    n_cols = check_int_in_range(n_cols, "n_cols", 2)
    if n_rows * n_cols > PCA_MAX_ENTRIES:
        raise InvalidParameterError(
            "n_rows * n_cols must be <= 2^26 (the PCA test matrix is built in "
            f"memory), got n_rows * n_cols = {n_rows * n_cols}."
        )
    if os.path.lexists(path) and not overwrite:
        raise StoreLayoutError(
            f"{path!r} already exists; pass --overwrite to replace it."
        )
    data = coherent_matrix(
        n_rows,
        n_cols,
        rank,
        support=support,
        top=top,
        bottom=bottom,
        head_ratio=head_ratio,
        rng=seed,
    )
    m, n = data.A.shape
    stored = data.A.astype(dtype, copy=False)
    stored_max = float(
        np.sqrt(np.einsum("ij,ij->i", stored, stored, dtype=np.float64).max())
    )
    if stored_max > 1.0:
        raise InvalidParameterError(
            f"rows of A must have norm <= 1, got a largest row norm of {stored_max:.9g} "
            f"after the cast to {dtype}; lower top or bottom slightly, or use "
            f"dtype='float64', got top={top!r}, bottom={bottom!r}."
        )
    cr = m if chunks[0] == -1 else min(int(chunks[0]), m)
    cc = n if chunks[1] == -1 else min(int(chunks[1]), n)
    meta = {
        "kind": "pca-coherent",
        "rank": int(rank),
        "support": data.support,
        "top": float(top),
        "bottom": float(bottom),
        "head_ratio": float(head_ratio),
        "seed": seed,
        "coherence": data.coherence,
        "row_coherence": data.row_coherence,
        "gap_k": data.gap_k,
        "kappa_k": data.kappa_k,
        "max_row_norm": stored_max,
        "singular_values": data.singular_values.tolist(),
        "top_right_singular_vectors": data.Vk.tolist(),
    }
    _publish(
        path, stored.shape, stored.dtype, (cr, cc),
        lambda b: stored[b * cr : (b + 1) * cr], meta, progress,
    )  # fmt: skip
    return meta


def generate_sparse_store(
    path: str | os.PathLike[str],
    n_rows: int,
    n_cols: int,
    *,
    density: float,
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
    """Write a sparse matrix with a known spectrum as a CSR group (AnnData's layout).

    The matrix is block diagonal up to a permutation of its columns: ``g =
    round(1 / density)`` blocks, block ``j`` on a contiguous range of about
    ``n_rows / g`` rows and a random set of about ``n_cols / g`` columns, dense
    inside (``U_j diag(sigma_j) V_j^T`` with Haar ``U_j``, ``V_j``), zero outside,
    so about ``density * n_rows * n_cols`` entries are stored. The spectrum of
    the whole matrix is the union of the blocks' spectra: the values of
    :func:`~pipeline.linalg.synthetic.make_spectrum` (``r = min(n_rows, n_cols,
    max_rank)`` terms) are dealt to the blocks in turn, each block keeping at
    most ``min(rows, columns)`` of its own. The matrix is scaled to the largest
    row norm ``max_row_norm``, and the exact singular values are recorded in
    ``attrs["dplr_synthetic"]``, as :func:`generate_store` records them. A
    block dealt no value (``g > r``) is stored as explicit zeros, so the number
    of stored entries does not depend on the spectrum.

    Parameters
    ----------
    density : float
        In ``(0, 1]``, with ``1 / density <= min(n_rows, n_cols)``.
    chunks : tuple of (int, int)
        ``chunks[0]``: rows written at once (-1: a whole block).

    The other parameters are those of :func:`generate_store`.

    Returns
    -------
    dict
        The metadata written to the attributes.
    """
    m, n = int(n_rows), int(n_cols)
    if m < 1 or n < 1:
        raise InvalidParameterError(
            f"n_rows and n_cols must be >= 1, got shape ({m}, {n})."
        )
    if not 0.0 < float(density) <= 1.0 or round(1.0 / density) > min(m, n):
        raise InvalidParameterError(
            f"--sparse must be in [1 / min(rows, cols), 1] = [{1 / min(m, n):.3g}, 1], "
            f"got --sparse {density!r}."
        )
    g = round(1.0 / density)
    sigma = make_spectrum(
        min(m, n, int(max_rank)), kind=spectrum, decay=decay, head=head,
        head_value=head_value,
    )  # fmt: skip
    block = _sparse_blocks(m, n, g, sigma, seed)
    # out of core: one block's factors at a time, made again from its seed when
    # it is written (a pass for the largest row norm, then the writing pass)
    row_max, values = 0.0, []
    for j in range(g):
        u, s, _, _ = block(j)
        row_max = max(row_max, float(np.sqrt(((u * s) ** 2).sum(axis=1)).max()))
        values.append(s)
        del u
    scale = float(max_row_norm) / row_max
    kept = np.sort(np.concatenate(values))[::-1]
    meta = {
        "spectrum": spectrum, "decay": decay, "head": head, "head_value": head_value,
        "rank": int(kept.size), "scale": scale, "max_row_norm": max_row_norm,
        "seed": seed, "density": float(density), "blocks": g,
        "singular_values": (scale * kept).tolist(),
    }  # fmt: skip
    step = None if chunks[0] == -1 else max(1, int(chunks[0]))

    def bands() -> Any:
        for j in range(g):
            u, s, v, cols = block(j)
            w = ((scale * s)[:, None] * v.T).astype(np.float64)  # r_j x b_j
            rows = u.shape[0]
            for r0 in range(0, rows, step or rows):
                dense = (u[r0 : r0 + (step or rows)] @ w).astype(dtype)
                band = sp.csr_matrix(
                    (dense.ravel(), np.tile(cols, dense.shape[0]),
                     np.arange(dense.shape[0] + 1) * cols.size),
                    shape=(dense.shape[0], n),
                )  # fmt: skip
                yield band
            if progress is not None:
                progress(j + 1, g)

    write_csr(
        local_path(path, "generated store"), bands(), shape=(m, n),
        overwrite=overwrite, attrs={"dplr_synthetic": meta},
    )  # fmt: skip
    return meta


def _sparse_blocks(
    m: int, n: int, g: int, sigma: np.ndarray, seed: int
) -> Callable[[int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """A function of ``j``: ``(U_j, sigma_j, V_j, columns_j)`` of diagonal block
    ``j`` of ``g``, made from its own seed on every call (the same arrays each
    time), so that only the block being written is in memory: ``U_j`` has about
    ``m / g`` rows and ``len(sigma_j)`` columns."""
    rng = np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(2,)))
    )
    row_sizes = [len(a) for a in np.array_split(np.arange(m), g)]
    col_sets = np.array_split(rng.permutation(n), g)

    def block(j: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        cols = np.sort(col_sets[j]).astype(np.int64)
        s = sigma[j::g][: min(row_sizes[j], cols.size)]
        bj = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(3, j)))
        )
        u = orthonormal_columns(row_sizes[j], s.size, bj)
        return u, s, orthonormal_columns(cols.size, s.size, bj), cols

    return block


def synthetic_truth(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """The ground truth that :func:`generate_store` or :func:`generate_pca_store`
    recorded in the array at ``path``, or None.

    None when ``path`` is None or an object-store URL (only local stores are
    looked at), does not exist, is not a Zarr array, or has no
    ``attrs["dplr_synthetic"]`` (a store from any other writer). The attributes
    are public facts of synthetic test data, not statistics of private data.

    Returns
    -------
    dict or None
        The recorded metadata (``singular_values`` among it) and ``shape``, the
        array's (n_rows, n_cols).
    """
    if path is None or objectstore.is_url(os.fspath(path)):
        return None
    path = os.fspath(path)
    if not os.path.isdir(path):
        return None
    try:
        z: Any = zarr.open(store=path, mode="r")  # an array, or a CSR group
        meta = z.attrs.get("dplr_synthetic")
    except (OSError, ValueError, KeyError, TypeError):  # zarr's errors are ValueErrors
        return None
    if not isinstance(meta, dict) or "singular_values" not in meta:
        return None
    shape = z.shape if isinstance(z, zarr.Array) else z.attrs.get("shape")
    return {**meta, "shape": [int(s) for s in shape]}


def _left_factor(m: int, r: int, cr: int, seed: int) -> Callable[[int], np.ndarray]:
    """Row block ``b`` (rows ``b cr : (b + 1) cr``) of an (m, r) matrix with
    orthonormal columns, the same for every call, built from Gaussian blocks.

    Small factors are orthonormalised in memory; larger ones as ``U = G R^{-1}``
    with ``R`` from the Gram matrix of all blocks (CholeskyQR, well conditioned
    for m >> r), so each block is regenerated from its seed when it is needed.
    """

    def gauss_block(b: int) -> np.ndarray:
        g = np.random.Generator(
            np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(1, b)))
        )
        return g.standard_normal((min(cr, m - b * cr), r))

    nblocks = -(-m // cr)
    if m * r <= IN_MEMORY_LIMIT:
        U = orthonormal_columns_from(
            np.vstack([gauss_block(b) for b in range(nblocks)])
        )
        return lambda b: U[b * cr : (b + 1) * cr]
    gram = np.zeros((r, r))
    for b in range(nblocks):
        g = gauss_block(b)
        gram += g.T @ g
    R = cholesky_factor(gram)
    return lambda b: sla.solve_triangular(R, gauss_block(b).T, trans="T", lower=False).T


def _publish(
    path: str,
    shape: tuple[int, int],
    dtype: np.dtype[Any],
    chunks: tuple[int, int],
    row_block: Callable[[int], np.ndarray],
    meta: dict[str, Any],
    progress: Callable[[int, int], None] | None,
) -> None:
    """Write the row blocks ``row_block(b)`` (``chunks[0]`` rows each) under a
    temporary name beside ``path``, then rename the array into place."""
    parent, base = os.path.split(local_path(path, "generated store"))
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    cr = chunks[0]
    nblocks = -(-shape[0] // cr)
    try:
        z = zarr.create_array(
            store=tmp, shape=shape, dtype=dtype, chunks=chunks, zarr_format=3
        )
        for b in range(nblocks):
            z[b * cr : (b + 1) * cr] = row_block(b)
            if progress is not None:
                progress(b + 1, nblocks)
        z.attrs["dplr_synthetic"] = meta
        if os.path.lexists(path):
            shutil.rmtree(path)
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def orthonormal_columns_from(G: np.ndarray) -> np.ndarray:
    Q, R = np.linalg.qr(G)
    return Q * np.sign(np.diag(R))

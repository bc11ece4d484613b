"""Which random operator a sketch uses: the kinds, and one constructor for all."""

from __future__ import annotations

import hashlib

from pipeline._sealed import Sealed
from pipeline.params import DEFAULT_TILE_SIZE, OperatorKind
from pipeline.sketches.gaussian import GaussianOperator, OperatorCode
from pipeline.sketches.sparse import DEFAULT_NNZ, SparseSignOperator

#: Any sketch operator: both kinds offer ``block``, ``rows``, ``dense``, ``left``
#: and ``right`` with the same meaning.
SketchOperator = GaussianOperator | SparseSignOperator


_SPARSE_CODE = {
    OperatorCode.S: OperatorCode.S_SPARSE,
    OperatorCode.T: OperatorCode.T_SPARSE,
    OperatorCode.T_PAD: OperatorCode.T_PAD_SPARSE,
}


def make_operator(
    kind: OperatorKind,
    *,
    root: int | Sealed,
    code: OperatorCode,
    length: int,
    dim: int,
    tile_size: int = DEFAULT_TILE_SIZE,
    nnz: int = DEFAULT_NNZ,
) -> SketchOperator:
    """The operator ``code`` of ``kind``; sparse kinds get their own stream code.

    Examples
    --------
    >>> make_operator(OperatorKind.SPARSE_SIGN, root=1, code=OperatorCode.S, length=10, dim=4)
    SparseSignOperator(code=12, length=10, dim=4, nnz=8, tile_size=1024)
    """
    if kind is OperatorKind.SPARSE_SIGN:
        if code not in _SPARSE_CODE:
            raise ValueError(f"operator {code.name} has no sparse sign version.")
        return SparseSignOperator(
            root=root,
            code=_SPARSE_CODE[code],
            length=length,
            dim=dim,
            nnz=nnz,
            tile_size=tile_size,
        )
    return GaussianOperator(
        root=root, code=code, length=length, dim=dim, tile_size=tile_size
    )


__all__ = ["OperatorKind", "SketchOperator", "make_operator", "seed_fingerprint"]


def seed_fingerprint(seed: int) -> str:
    """One-way tag of a sketch seed, for reports and ledgers (spec 4.4)."""
    return hashlib.sha256(f"dplr-sketch-seed:{seed}".encode()).hexdigest()[:16]

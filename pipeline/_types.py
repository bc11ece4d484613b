"""Shared type aliases."""

from __future__ import annotations

from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.floating[Any]]
IntArray: TypeAlias = npt.NDArray[np.integer[Any]]
Shape2D: TypeAlias = tuple[int, int]
RngLike: TypeAlias = (
    int | np.random.SeedSequence | np.random.BitGenerator | np.random.Generator | None
)

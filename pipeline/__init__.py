"""dplr: differentially private low-rank factorization of Zarr matrices on Dask.

Public API
----------
factorize
    One-pass (epsilon, delta)-DP factorization ``A ~ U diag(S) V^T`` of a Zarr
    path, zarr array, dask array or numpy array.
pca
    (epsilon, delta)-DP top-k principal subspace of a matrix whose rows are
    individuals.
Factorization
    Its result (``U``, ``S``, ``V``, ``report``).
Ledger
    A dataset's persistent privacy ledger.
read_release, generate_store
    Reading a published release; writing a synthetic matrix with a known spectrum.
DPPCA, DPLowRank
    scikit-learn transformers over the private PCA and the private factorization.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.errors import (
    BudgetExceededError,
    InvalidParameterError,
    NonFiniteInputError,
    PipelineError,
    PrivacyConfigError,
    SchedulerUnavailableError,
    StoreLayoutError,
)

if TYPE_CHECKING:
    from pipeline.accounting.ledger import Ledger
    from pipeline.algorithms.base import Factorization
    from pipeline.api import factorize, pca
    from pipeline.estimators import DPPCA, DPLowRank
    from pipeline.io import generate_store, read_release

from pipeline._version import __version__

__all__ = [
    "DPPCA",
    "BudgetExceededError",
    "DPLowRank",
    "Factorization",
    "InvalidParameterError",
    "Ledger",
    "NonFiniteInputError",
    "PipelineError",
    "PrivacyConfigError",
    "SchedulerUnavailableError",
    "StoreLayoutError",
    "__version__",
    "factorize",
    "generate_store",
    "pca",
    "read_release",
]


def __getattr__(name: str) -> Any:
    # Everything but the errors is loaded on first use. A dask worker process
    # imports the module that started it (``dplr``, so ``pipeline``) before it
    # runs anything: it should not pay for the accounting (scipy.optimize),
    # the API, zarr or scikit-learn it will never use.
    if name in ("factorize", "pca"):
        from pipeline import api

        return getattr(api, name)
    if name == "Ledger":
        from pipeline.accounting.ledger import Ledger

        return Ledger
    if name == "Factorization":
        from pipeline.algorithms.base import Factorization

        return Factorization
    if name in ("read_release", "generate_store"):
        from pipeline import io

        return getattr(io, name)
    # estimators import scikit-learn; load it only when asked for
    if name in ("DPPCA", "DPLowRank"):
        from pipeline import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")

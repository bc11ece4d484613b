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
    from pipeline.io.release import read_release
    from pipeline.io.synthetic import generate_store

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
        from pipeline import api  # heavy: numpy, scipy, kept off `import pipeline`

        return getattr(api, name)
    if name == "Ledger":
        from pipeline.accounting.ledger import Ledger  # heavy: numpy, scipy

        return Ledger
    if name == "Factorization":
        from pipeline.algorithms.base import Factorization  # heavy: numpy, scipy

        return Factorization
    if name == "read_release":
        from pipeline.io.release import read_release  # heavy: zarr, dask, numpy

        return read_release
    if name == "generate_store":
        from pipeline.io.synthetic import generate_store  # heavy: zarr, numpy

        return generate_store
    if name in ("DPPCA", "DPLowRank"):
        from pipeline import estimators  # heavy: sklearn, only when asked for

        return getattr(estimators, name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")

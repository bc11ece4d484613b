"""Coherence-adaptive DP PCA: Analyze Gauss and the private clipped power method.

Problem. ``A`` is an (n, d) matrix whose rows are individuals. Find ``X`` of
shape (d, k) with orthonormal columns whose span is close to ``span(V_k)``, the
top-k right singular subspace of ``A`` (uncentred PCA: the top eigenvectors of
``A^T A``), measured by ``sin theta_max = ||(I - X X^T) V_k||_2``, such that
releasing ``X`` is (epsilon, delta)-DP for neighbours that differ in one row:
present or a zero row (the default), or replaced by another; n is public under
both (spec power-pca section 1.2).

Method (spec sections 2.1-2.3).

1. Rows are clipped to norm ``<= 1 - 1e-9`` before anything touches them
   (after an optional public rescaling ``a_i / C``); a row holding NaN or Inf
   becomes the zero row -- silently, because raising or counting would be a
   data-dependent side channel (spec 1.4, rules 1-2).
2. Analyze Gauss [DTTZ14]: release ``M = A^T A + noise_init sym(G)`` and take
   its top-k eigenvectors ``X0``. Alone (with the whole budget) it is the
   baseline method ``"analyze-gauss"``.
3. The preconditioned clipped power method, ``t = 0 .. T-1``: release
   ``H = X^T A^T A X + noise_H sym(G_t)``; ``B = (H floored at gamma)^(-1/2)``;
   release ``Z = sum_i a_i Clip_R(a_i^T X B) + noise_Z R G~_t``; ``X = qr(Z)``.
   ``B`` whitens ``A X`` so that, near the answer, ``a_i^T X B ~ e_i^T U_k``,
   whose norm is at most ``sqrt(k) ||U||_inf``: on incoherent data a small
   clip radius ``R`` -- hence little noise -- suffices [P, section 3].

Everything data-derived that leaves :func:`run_pca` passes through exactly one
Gaussian release (``M``, ``H_t``, ``Z_t``) whose noise is drawn here, on the
reduced statistic, from the secret keyed generator of
:mod:`pipeline.mechanisms.noise`; ``B``, ``X`` and the eigenvalues are
post-processing of releases only. Exact aggregates travel inside
:class:`Secret` wrappers that refuse to be printed or pickled.

Passes over A: 1 (Gram) + T (one per iteration); the ``H`` releases are
computed on the client from the Gram matrix (spec 4.4). The ``"two-pass"``
route recomputes ``H`` from the data instead (1 + 2T passes) and never holds a
d x d matrix after the first step (spec 4.5).

The modules, all entered through this package:
:mod:`~pipeline.algorithms.pca.power` (the row sources, the release journals,
the releases -- keyed noise, journal, the one charge -- and :func:`run_pca`),
:mod:`~pipeline.algorithms.pca.kernels` (row preparation and per-band kernels),
:mod:`~pipeline.algorithms.pca.linalg` (secrets and the post-processing of
releases), :mod:`~pipeline.algorithms.pca.plan` (parameters and plan),
:mod:`~pipeline.algorithms.pca.auto` (the ``auto`` rule) and
:mod:`~pipeline.algorithms.pca.selection` (the private selection run).

References
----------
.. [P] Coherence-adaptive differentially private PCA via a preconditioned,
   clipped block power method (seed paper; spec power-pca).
.. [DTTZ14] Dwork, Talwar, Thakurta, Zhang. Analyze Gauss: optimal bounds for
   privacy-preserving principal component analysis. STOC 2014.
"""

from __future__ import annotations

from pipeline.algorithms.pca.auto import (
    AUTO_ITERATIONS,
    AUTO_MARGIN,
    AutoChoice,
    auto_radius,
    choose_method,
)
from pipeline.algorithms.pca.kernels import (
    RADIUS_SLACK,
    ROW_CLIP,
    SUB_BLOCK_BYTES,
    band_gram,
    band_pass,
    band_products,
    band_update,
    clip_rows,
    prep_factors,
    prep_rows,
    update_factors,
)
from pipeline.algorithms.pca.linalg import (
    Secret,
    eig_floor_inv_sqrt,
    qr_pos,
    sym,
    topk_eig,
)
from pipeline.algorithms.pca.plan import (
    GRAM_CLIENT_BYTES,
    NONPRIVATE_GAMMA,
    PcaPlan,
    plan_pca,
)
from pipeline.algorithms.pca.power import (
    ArrayRowSource,
    MemoryJournal,
    PcaRelease,
    PcaResult,
    ReleaseJournal,
    RowSource,
    run_pca,
)
from pipeline.algorithms.pca.selection import (
    MAX_CONCURRENT_TRIALS,
    SelectionResult,
    default_selection_grids,
    exact_score,
    run_selection,
    score_basis,
    score_setup,
)

__all__ = [
    "AUTO_ITERATIONS",
    "AUTO_MARGIN",
    "GRAM_CLIENT_BYTES",
    "MAX_CONCURRENT_TRIALS",
    "NONPRIVATE_GAMMA",
    "RADIUS_SLACK",
    "ROW_CLIP",
    "SUB_BLOCK_BYTES",
    "ArrayRowSource",
    "AutoChoice",
    "MemoryJournal",
    "PcaPlan",
    "PcaRelease",
    "PcaResult",
    "ReleaseJournal",
    "RowSource",
    "Secret",
    "SelectionResult",
    "auto_radius",
    "band_gram",
    "band_pass",
    "band_products",
    "band_update",
    "choose_method",
    "clip_rows",
    "default_selection_grids",
    "eig_floor_inv_sqrt",
    "exact_score",
    "plan_pca",
    "prep_factors",
    "prep_rows",
    "qr_pos",
    "run_pca",
    "run_selection",
    "score_basis",
    "score_setup",
    "sym",
    "topk_eig",
    "update_factors",
]

"""Diffprivlib's Bingham sampler with its acceptance exponent corrected.

:func:`corrected_bingham` patches ``diffprivlib.mechanisms.Bingham.randomise`` with
:func:`bingham_randomise_corrected` (same envelope, same ``b``, same random stream;
only the exponent of the acceptance ratio differs). ``bench_pca.py`` and
``pca_real_part.py`` both use it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np


def bingham_randomise_corrected(self: Any, value: Any) -> Any:
    """diffprivlib 0.6.6 ``Bingham.randomise`` with the acceptance ratio of Kent et al. (2018).

    Identical to the shipped method (same envelope, same ``b``, same random draws)
    except one exponent: a proposal ``x`` from the angular central Gaussian with
    density proportional to ``(x^T Omega x)^(-q/2)`` must be accepted with
    probability ``exp(-x^T A x) (x^T Omega x)^(+q/2) / M``; the shipped code divides
    by ``(x^T Omega x)^(q/2)``. Computed in logs (the factor reaches 1e147 here).
    """
    self._check_all(value)
    eigvals, eigvecs = np.linalg.eigh(value)
    dims = value.shape[0]
    if dims == 1:
        return np.ones((1, 1))
    if self.sensitivity / self.epsilon == 0:
        return eigvecs[:, eigvals.argmax()]
    value_translated = (
        self.epsilon * (eigvals.max() * np.eye(dims) - value) / 4 / self.sensitivity
    )
    translated_eigvals = np.linalg.eigvalsh(value_translated)
    left, right, mid = 1, dims, (1 + dims) / 2
    old_interval_size = (right - left) * 2
    while right - left < old_interval_size:
        old_interval_size = right - left
        mid = (right + left) / 2
        f_mid = np.array([1 / (mid + 2 * eig) for eig in translated_eigvals]).sum()
        if f_mid <= 1:
            right = mid
        if f_mid >= 1:
            left = mid
    b_const = mid
    omega = np.eye(dims) + 2 * value_translated / b_const
    omega_inv = np.linalg.inv(omega)
    log_norm_const = -(dims - b_const) / 2 + (dims / 2) * math.log(dims / b_const)
    while True:
        rnd_vec = self._rng.multivariate_normal(
            np.zeros(dims), omega_inv / 4, size=4
        ).sum(axis=0)
        unit_vec = rnd_vec / np.linalg.norm(rnd_vec)
        log_prob = (
            -unit_vec.dot(value_translated).dot(unit_vec)
            - log_norm_const
            + (dims / 2) * math.log(unit_vec.dot(omega).dot(unit_vec))
        )
        if self._rng.random() <= math.exp(min(log_prob, 0.0)):
            return unit_vec


@contextlib.contextmanager
def corrected_bingham() -> Iterator[None]:
    from unittest import mock

    from diffprivlib.mechanisms import Bingham

    with mock.patch.object(Bingham, "randomise", bingham_randomise_corrected):
        yield

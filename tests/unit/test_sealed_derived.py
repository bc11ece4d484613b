"""Values derived from a sealed secret live exactly as long as the secret.

``pipeline._sealed.derived`` lets a worker keep, e.g., the operator block that
every row chunk of a pass multiplies by, instead of regenerating it per task.
Nothing derived from a job's secret may outlive the job on a worker.
"""

from __future__ import annotations

import pickle

import numpy as np

from pipeline import _sealed
from pipeline.sketches.gaussian import GaussianOperator, OperatorCode


def _on_worker(value: int) -> _sealed.Sealed:
    """The sealed value as a worker sees it: a token resolved via the registry."""
    token_only = pickle.loads(pickle.dumps(_sealed.seal(value)))
    _sealed.install(token_only.token, value)
    return token_only


def test_derived_is_computed_once_per_key_while_installed_and_dropped_with_it() -> None:
    secret = _on_worker(20240611)
    calls: list[str] = []

    def make(tag: str):  # type: ignore[no-untyped-def]
        def run() -> str:
            calls.append(tag)
            return f"value-{tag}"

        return run

    try:
        assert _sealed.derived(secret, "a", make("a")) == "value-a"
        assert _sealed.derived(secret, "a", make("a")) == "value-a"
        assert _sealed.derived(secret, "b", make("b")) == "value-b"
        assert calls == ["a", "b"]
    finally:
        _sealed.remove(secret.token)
    assert secret.token not in _sealed._DERIVED
    # reinstalled (a later job with the same token): computed afresh
    _sealed.install(secret.token, 20240611)
    try:
        _sealed.derived(secret, "a", make("a"))
        assert calls == ["a", "b", "a"]
    finally:
        _sealed.remove(secret.token)


def test_nothing_is_kept_for_plain_values_or_in_the_creating_process() -> None:
    calls: list[int] = []

    def make() -> int:
        calls.append(1)
        return 1

    _sealed.derived(7, "k", make)
    _sealed.derived(7, "k", make)
    local = _sealed.seal(7)  # holds its value, never installed: nothing would drop it
    _sealed.derived(local, "k", make)
    _sealed.derived(local, "k", make)
    assert len(calls) == 4
    assert local.token not in _sealed._DERIVED


def test_at_most_a_few_values_per_secret() -> None:
    secret = _on_worker(5)
    try:
        for i in range(3 * _sealed.DERIVED_PER_SECRET):
            _sealed.derived(secret, i, lambda i=i: i)
        kept = _sealed._DERIVED[secret.token]
        assert len(kept) == _sealed.DERIVED_PER_SECRET
        assert max(kept) == 3 * _sealed.DERIVED_PER_SECRET - 1  # the newest are kept
    finally:
        _sealed.remove(secret.token)


def test_gaussian_right_products_are_unchanged_and_the_kept_block_is_read_only() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 30))
    secret = _on_worker(99)
    try:
        op = GaussianOperator(root=secret, code=OperatorCode.PHI, length=30, dim=7, tile_size=8)
        plain = GaussianOperator(root=99, code=OperatorCode.PHI, length=30, dim=7, tile_size=8)
        for dtype in (np.float64, np.float32, np.float64):  # the second float64 is a hit
            np.testing.assert_array_equal(
                op.right(x[:, 5:20], 5, 20, dtype), plain.right(x[:, 5:20], 5, 20, dtype)
            )
        (kept, *_) = _sealed._DERIVED[secret.token].values()
        assert not kept.flags.writeable
    finally:
        _sealed.remove(secret.token)

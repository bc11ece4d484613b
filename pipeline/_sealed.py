"""Secrets that travel to Dask workers by reference, never inside a task.

A sketch seed or a noise key used by a task must not appear in the task's
arguments: the scheduler, its logs and anyone who can read a serialized graph
would see it. :class:`Sealed` wraps such a value. In the process that created
it, it holds the value; pickled, it is only a random token. A process that
needs the value looks the token up in its own registry, which the execution
layer fills on every worker, out of band (a worker plugin), for the duration of
one job. The value is resolved lazily, where a tile is generated, so a process
that only forwards the task (the scheduler) never needs it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["Sealed", "derived", "install", "remove", "seal", "unseal"]

_REGISTRY: dict[str, Any] = {}

#: Values computed from a secret (e.g. an operator block from the sketch seed),
#: kept per token while the secret is installed and dropped with it.
_DERIVED: dict[str, dict[Any, Any]] = {}
_DERIVED_LOCK = threading.Lock()
#: At most this many derived values per secret (oldest dropped first).
DERIVED_PER_SECRET = 8

T = TypeVar("T")


class Sealed:
    """A secret value that pickles as an opaque token.

    Examples
    --------
    >>> import pickle
    >>> s = seal(12345)
    >>> s.get(), "12345" in repr(s)
    (12345, False)
    >>> pickle.dumps(s) == pickle.dumps(Sealed(s.token))  # the token, nothing else
    True
    """

    __slots__ = ("_value", "token")

    def __init__(self, token: str, value: Any = None) -> None:
        self.token = token
        self._value = value

    def get(self) -> Any:
        """The value: held, or looked up in this process's registry."""
        if self._value is None:
            try:
                self._value = _REGISTRY[self.token]
            except KeyError:
                raise RuntimeError(
                    "a sealed secret was used in a process that does not hold it (the "
                    "job's worker plugin is missing on this worker); retry the job."
                ) from None
        return self._value

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (Sealed, (self.token,))

    def __repr__(self) -> str:
        return "Sealed(<redacted>)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sealed) and other.token == self.token

    def __hash__(self) -> int:
        return hash(self.token)


def seal(value: Any) -> Sealed:
    """Wrap ``value`` under a fresh random token (the caller installs it where needed)."""
    return Sealed(secrets.token_hex(16), value)


def unseal(value: Any) -> Any:
    """``value.get()`` for a :class:`Sealed`, ``value`` itself otherwise."""
    return value.get() if isinstance(value, Sealed) else value


def install(token: str, value: Any) -> None:
    """Make ``token`` resolve to ``value`` in this process."""
    _REGISTRY[token] = value


def remove(token: str) -> None:
    """Forget ``token`` in this process, and everything derived from it."""
    _REGISTRY.pop(token, None)
    with _DERIVED_LOCK:
        _DERIVED.pop(token, None)


def derived(secret: Any, key: Any, make: Callable[[], T]) -> T:
    """``make()``, computed once per ``key`` while the sealed ``secret`` is
    installed in this process (:func:`install`); recomputed every call for a
    plain value, or in the process that created the secret (nothing would
    ever drop it there).

    For values that every task of a job recomputes from the same secret: an
    operator block shared by all row chunks of a pass. They live exactly as
    long as the secret itself on this worker, so nothing derived from it
    outlives the job.
    """
    if not isinstance(secret, Sealed) or secret.token not in _REGISTRY:
        return make()
    with _DERIVED_LOCK:
        cache = _DERIVED.get(secret.token)
        if cache is not None and key in cache:
            return cache[key]  # type: ignore[no-any-return]
    value = make()
    with _DERIVED_LOCK:
        if secret.token in _REGISTRY:  # not removed meanwhile
            cache = _DERIVED.setdefault(secret.token, {})
            cache[key] = value
            while len(cache) > DERIVED_PER_SECRET:
                del cache[next(iter(cache))]
    return value

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
from typing import Any

__all__ = ["Sealed", "install", "remove", "seal", "unseal"]

_REGISTRY: dict[str, Any] = {}


class Sealed:
    """A secret value that pickles as an opaque token.

    Examples
    --------
    >>> import pickle
    >>> s = seal(12345)
    >>> s.get(), "12345" in repr(s)
    (12345, False)
    >>> b"12345" in pickle.dumps(s) or (12345).to_bytes(2, "little") in pickle.dumps(s)
    False
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
    """Forget ``token`` in this process."""
    _REGISTRY.pop(token, None)

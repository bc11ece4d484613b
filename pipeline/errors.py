"""Exceptions and warnings raised by dplr.

Every message names the parameter, the constraint and the value received, or the
chunk and the problem found -- never a data value (design.md section 3, rule 6).

The command line maps these to exit codes: :class:`PipelineError` -> 2,
:class:`BudgetExceededError` -> 3, anything else -> 1 (with a traceback).
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "ClusterMismatchError",
    "EpochError",
    "HorizonExceededError",
    "InvalidParameterError",
    "NonFiniteInputError",
    "NumericalWarning",
    "PerformanceWarning",
    "PipelineError",
    "PipelineWarning",
    "PrivacyConfigError",
    "PrivacyUnitError",
    "SchedulerUnavailableError",
    "StoreLayoutError",
]


class PipelineError(Exception):
    """Base class of every error that is the user's to fix (exit code 2).

    Parameters
    ----------
    *args
        The message (as for any exception), phrased for the Python API.
    cli : str or None, optional
        The same message as the command line states it (its commands and flags
        instead of Python calls); ``dplr`` prints it instead of the message.
        None: the message speaks to both.
    """

    def __init__(self, *args: object, cli: str | None = None) -> None:
        super().__init__(*args)
        self.cli = cli


class InvalidParameterError(PipelineError, ValueError):
    """A parameter is out of range or inconsistent with another one."""


class PrivacyConfigError(InvalidParameterError):
    """A privacy parameter (epsilon, delta, clip norm, unit) is invalid."""


class PrivacyUnitError(InvalidParameterError):
    """An entity's updates contradict the declared privacy unit (e.g. two rows)."""


class EpochError(InvalidParameterError):
    """An epoch is out of order: already released, or not the next one."""


class StoreLayoutError(PipelineError, ValueError):
    """An input or output store is missing, malformed, or laid out unusably."""


class NonFiniteInputError(StoreLayoutError):
    """The input is not numeric, or an unclipped sketch of it overflowed; the
    message names the chunk, never the values (NaN/Inf input is no error: its
    individuals count as zero, docs/privacy.md)."""


class SchedulerUnavailableError(PipelineError, ConnectionError):
    """The requested Dask scheduler could not be reached."""


class ClusterMismatchError(PipelineError, RuntimeError):
    """The cluster's workers lack this package or run other versions of it."""


class BudgetExceededError(PipelineError):
    """The plan would exceed the dataset's declared lifetime privacy budget.

    Raised before any data is read; nothing is charged (exit code 3).
    """


class PipelineWarning(UserWarning):
    """Base class of dplr's warnings."""


class NumericalWarning(PipelineWarning):
    """A numerical quantity is poorly conditioned; the result may be inaccurate."""


class PerformanceWarning(PipelineWarning):
    """A choice of layout or size will make the job slower than it needs to be."""


class HorizonExceededError(BudgetExceededError):
    """An epoch lies beyond the stream's declared horizon (exit code 3).

    The stream's budget was calibrated for ``horizon`` epochs; releasing more
    would need more budget, so it is refused like an exhausted budget.
    """

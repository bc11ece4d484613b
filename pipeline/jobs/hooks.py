"""The hooks a job hands an algorithm's run, built the same way for every release.

An algorithm's run takes one :class:`~pipeline.algorithms.base.ReleaseHooks`:
the job's noise key and sketch seed (drawn, or resumed from its journal, by
:meth:`~pipeline.jobs.engine.ReleaseJob.prepare`), a journal (the job's, seen
through an adapter of the release's kind), the job's one ledger charge and its
progress. :func:`release_hooks` builds it from a prepared job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline.algorithms.base import ReleaseHooks, ReleaseJournal
from pipeline.jobs.engine import ReleaseJob

__all__ = ["release_hooks"]


def release_hooks(
    job: ReleaseJob,
    *,
    algorithm: str,
    details: Mapping[str, Any],
    journal: ReleaseJournal | None,
    progress: bool = True,
) -> ReleaseHooks:
    """The hooks of ``job``'s run.

    Parameters
    ----------
    job : ReleaseJob
        Prepared (:meth:`~pipeline.jobs.engine.ReleaseJob.prepare`): its noise
        key and sketch seed are set.
    algorithm : str
        The ledger record's algorithm name.
    details : mapping
        The ledger record's public details.
    journal : ReleaseJournal or None
        The job's journal as the run's kind of release reads and writes it.
    progress : bool
        False withholds the run's steps (a private selection's would reveal
        its number of trials).

    Returns
    -------
    ReleaseHooks
        Its ``charge`` is :meth:`~pipeline.jobs.engine.ReleaseJob.charge`
        (once per release id, before any noise).
    """
    return ReleaseHooks(
        noise_key=job.noise_key,
        sketch_seed=job.sketch_seed,
        journal=journal,
        charge=lambda: job.charge(algorithm=algorithm, details=details),
        progress=job.runtime.say if progress else None,
    )

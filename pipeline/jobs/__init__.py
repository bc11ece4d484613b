"""Private releases as durable jobs: the one release job and one module per kind of release.

:mod:`~pipeline.jobs.engine` runs every release through the same steps (plan, refuse,
resume, passes, journal, charge the ledger once, noise, post-process, publish, clean
up) and knows no algorithm. :mod:`~pipeline.jobs.factorize`, :mod:`~pipeline.jobs.pca`,
:mod:`~pipeline.jobs.centred_pca`, :mod:`~pipeline.jobs.stream` and
:mod:`~pipeline.jobs.nightly` are its callers, one per kind of release; the faces
(:mod:`pipeline.api`, :mod:`pipeline.estimators`, :mod:`pipeline.cli`) call them.
Each builds the hooks an algorithm's run takes the same way
(:func:`pipeline.jobs.hooks.release_hooks`).
"""

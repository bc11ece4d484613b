"""The ``dplr`` command line, one module per verb.

:mod:`~pipeline.cli.main` builds the parser and runs :func:`main`;
:mod:`~pipeline.cli.common` holds what the verbs share (exit codes, option groups);
:mod:`~pipeline.cli.pca`, :mod:`~pipeline.cli.data` (``generate``, ``demo``) and
:mod:`~pipeline.cli.stream` (``stream``, ``nightly``) each register their verbs.
Nothing in :mod:`pipeline` imports this package but ``python -m pipeline``.
"""

from pipeline.cli.common import EXIT_BUDGET, EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from pipeline.cli.main import main

__all__ = ["EXIT_BUDGET", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "main"]

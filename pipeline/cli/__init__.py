"""The ``dplr`` command line, one module per verb.

:mod:`~pipeline.cli.main` builds the parser and runs :func:`main`;
:mod:`~pipeline.cli.common` holds what the verbs share (exit codes, option groups).
Each verb module has ``add_parser(subparsers)``, which registers its verb(s) and
sets the handler ``main`` dispatches to (``set_defaults(handler=...)``):
:mod:`~pipeline.cli.factorize`, :mod:`~pipeline.cli.pca`, :mod:`~pipeline.cli.data`
(``generate``, ``demo``), :mod:`~pipeline.cli.budget`, :mod:`~pipeline.cli.stream`,
:mod:`~pipeline.cli.nightly` and :mod:`~pipeline.cli.show` (with its pictures,
:mod:`~pipeline.cli.plot`).
Nothing in :mod:`pipeline` imports this package but ``python -m pipeline``.
"""

from pipeline.cli.common import EXIT_BUDGET, EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from pipeline.cli.main import main

__all__ = ["EXIT_BUDGET", "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "main"]

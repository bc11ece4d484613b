"""Public test helpers: reusable by the package's own tests and by downstream users.

* :mod:`pipeline.testing.audit` -- empirical privacy audits (lower confidence
  bounds on epsilon from threshold tests on neighbouring inputs).
"""

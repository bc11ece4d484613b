"""``python -m pipeline.cli`` is the ``dplr`` command, as ``python -m pipeline`` is."""

from pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

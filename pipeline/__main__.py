"""``python -m pipeline`` is the ``dplr`` command."""

from pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())

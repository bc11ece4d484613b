"""A text progress bar that works under a distributed client, on stderr.

``dask.diagnostics.ProgressBar`` prints nothing under a distributed client, and
``distributed.progress`` writes to stdout and erases itself; the CLI wants a
labelled bar per pass on stderr that stays on screen. The bar shows task counts
and elapsed time only -- never data.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from dask.utils import format_time
from distributed import futures_of
from distributed.diagnostics.progressbar import TextProgressBar


class PassProgressBar(TextProgressBar):
    """``[#####     ] 52% | label | 1.2s`` on ``stream`` until the keys finish."""

    def __init__(
        self, keys: Any, *, label: str, stream: TextIO | None = None, **kw: Any
    ) -> None:
        self._label = label
        self._stream = stream or sys.stderr
        self._frac = 0.0
        # distributed's TextProgressBar.__init__ is unannotated
        super().__init__(keys, **kw)  # type: ignore[no-untyped-call]

    def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:
        frac = (1 - remaining / all) if all else 1.0
        self._frac = frac
        bar = "#" * int(self.width * frac)
        msg = f"\r[{bar:<{self.width}}] {int(100 * frac):3d}% | {self._label} | {format_time(self.elapsed)}"
        self._stream.write(msg)
        self._stream.flush()

    def _draw_stop(self, **kwargs: Any) -> None:
        self._stream.write("\n")
        self._stream.flush()


def show_progress(
    client: Any, collections: list[Any], label: str, stream: TextIO | None
) -> None:
    """Block until ``collections`` (persisted) finish, drawing a bar on ``stream``."""
    futures = [f for c in collections for f in futures_of(c)]
    if not futures or stream is None:
        return
    PassProgressBar(
        futures,
        label=label,
        stream=stream,
        scheduler=client.scheduler.address,
        complete=True,
    )

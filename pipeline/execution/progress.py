"""A text progress bar that works under a distributed client, on stderr.

``dask.diagnostics.ProgressBar`` prints nothing under a distributed client, and
``distributed.progress`` writes to stdout and erases itself; the CLI wants a
labelled bar per pass on stderr that stays on screen. The bar shows task counts
and elapsed time only -- never data. Where a pass's duration is itself data (a
sparse input's work grows with its stored entries), the bar is untimed: it draws
its empty state and its full state, once each, whatever the pass took, so
neither the time shown nor the number of redraws depends on the data.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from dask.utils import format_time
from distributed import futures_of
from distributed.diagnostics.progressbar import TextProgressBar


class PassProgressBar(TextProgressBar):
    """``[#####     ] 52% | label | 1.2s`` on ``stream`` until the keys finish.

    ``timed=False``: ``[          ]   0% | label`` when the pass starts and the
    full bar when it ends, nothing between and no time (module docstring).
    """

    def __init__(
        self,
        keys: Any,
        *,
        label: str,
        stream: TextIO | None = None,
        timed: bool = True,
        **kw: Any,
    ) -> None:
        self._label = label
        self._stream = stream or sys.stderr
        self._frac = 0.0
        self._timed = timed
        self._drawn = False
        # distributed's TextProgressBar.__init__ is unannotated
        super().__init__(keys, **kw)  # type: ignore[no-untyped-call]

    def _draw_bar(self, remaining: int, all: int, **kwargs: Any) -> None:
        frac = (1 - remaining / all) if all else 1.0
        self._frac = frac
        if not self._timed:
            if not self._drawn:  # the empty bar, once, whatever the state
                self._drawn = True
                self._stream.write(f"\r[{'':<{self.width}}]   0% | {self._label}")
                self._stream.flush()
            return
        bar = "#" * int(self.width * frac)
        msg = f"\r[{bar:<{self.width}}] {int(100 * frac):3d}% | {self._label} | {format_time(self.elapsed)}"
        self._stream.write(msg)
        self._stream.flush()

    def _draw_stop(self, **kwargs: Any) -> None:
        if not self._timed and kwargs.get("status") == "finished":
            self._stream.write(f"\r[{'#' * self.width}] 100% | {self._label}")
        self._stream.write("\n")
        self._stream.flush()


def show_progress(
    client: Any,
    collections: list[Any],
    label: str,
    stream: TextIO | None,
    *,
    timed: bool = True,
) -> None:
    """Block until ``collections`` (persisted) finish, drawing a bar on ``stream``
    (``timed=False``: the untimed bar of a pass whose duration is data)."""
    futures = [f for c in collections for f in futures_of(c)]
    if not futures or stream is None:
        return
    PassProgressBar(
        futures,
        label=label,
        stream=stream,
        timed=timed,
        scheduler=client.scheduler.address,
        complete=True,
    )

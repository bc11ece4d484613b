"""Pictures of released spectra for ``dplr show --plot`` (PNG, SVG or HTML).

A :class:`Chart` says what is drawn (series of released values, a noise level, a
true spectrum), from released or public values only; :func:`write_chart` draws it
with matplotlib, an optional dependency (``pip install 'dplr[plot]'``) imported
only here and only when a picture is asked for. :func:`check_plot_path` refuses an
unusable destination before anything is read.
"""

from __future__ import annotations

import dataclasses
import html
import io
import os
import uuid
from typing import Any, Literal

from pipeline.errors import InvalidParameterError, PipelineError

__all__ = [
    "FIGURE_PIXELS",
    "SUFFIXES",
    "Chart",
    "Series",
    "check_plot_path",
    "write_chart",
]

#: The size of every picture, (width, height) in pixels (PNG at 100 dpi).
FIGURE_PIXELS = (800, 500)
_DPI = 100
#: The formats ``--plot`` writes, by file suffix.
SUFFIXES = (".png", ".svg", ".html")
MISSING_MATPLOTLIB = (
    "--plot needs matplotlib, which is not installed: pip install 'dplr[plot]'"
)

#: How each kind of series is drawn (matplotlib keyword arguments).
_STYLE: dict[str, dict[str, Any]] = {
    "released": {"marker": "o", "linestyle": "-", "linewidth": 1.5, "zorder": 3},
    "truth": {"marker": ".", "linestyle": "-", "linewidth": 1.0, "color": "0.45"},
    "noise": {"linestyle": "--", "linewidth": 1.5, "color": "tab:red"},
}


@dataclasses.dataclass(frozen=True)
class Series:
    """One series of a chart: ``y`` against ``x``.

    ``kind`` is ``"released"`` (a released spectrum), ``"truth"`` (a true spectrum
    known from generated data) or ``"noise"`` (a noise level: a horizontal line
    across the chart when ``x`` has one entry). ``gid`` names the series in an SVG
    (the ``id`` of its group).
    """

    label: str
    gid: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    kind: Literal["released", "truth", "noise"] = "released"


@dataclasses.dataclass(frozen=True)
class Chart:
    """What one picture shows: a title, axis labels and the series."""

    title: str
    xlabel: str
    ylabel: str
    series: tuple[Series, ...]


def check_plot_path(path: str) -> str:
    """``path`` if a picture can be written there; checked before anything is read.

    Raises
    ------
    InvalidParameterError
        If the suffix is not one of :data:`SUFFIXES`, the directory does not
        exist or is not writable, or ``path`` is a directory.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise InvalidParameterError(
            f"unknown plot format {suffix!r} of --plot {path!r}; name a file "
            "ending in .png, .svg or .html."
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InvalidParameterError(f"the directory of --plot {path!r} does not exist.")
    if os.path.isdir(path):
        raise InvalidParameterError(f"--plot {path!r} is a directory; name a file.")
    if not os.access(parent, os.W_OK):
        raise InvalidParameterError(
            f"the directory of --plot {path!r} is not writable."
        )
    return path


def write_chart(path: str, chart: Chart) -> None:
    """Draw ``chart`` to ``path`` (.png, .svg or .html with the SVG embedded).

    The picture is written under a temporary name beside ``path`` and renamed
    into place, so a failed drawing leaves nothing behind.

    Raises
    ------
    PipelineError
        If matplotlib is not installed (the message names ``dplr[plot]``).
    """
    suffix = os.path.splitext(path)[1].lower()
    fig = _figure(chart)
    parent, base = os.path.split(os.path.abspath(path))
    tmp = os.path.join(parent, f".{base}.tmp-{uuid.uuid4().hex}")
    try:
        if suffix == ".html":
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(_html(chart, _svg_text(fig)))
        else:
            # no date in the file: the same chart gives the same bytes
            fig.savefig(tmp, format=suffix[1:], metadata=_metadata(suffix))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _figure(chart: Chart) -> Any:
    """The chart as a matplotlib Figure (no pyplot: no global state, no display)."""
    try:
        # optional: matplotlib, the plot extra, imported only when a picture is drawn
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator  # optional: matplotlib
    except ImportError:
        raise PipelineError(MISSING_MATPLOTLIB) from None
    w, h = FIGURE_PIXELS
    fig = Figure(figsize=(w / _DPI, h / _DPI), dpi=_DPI, layout="constrained")
    ax = fig.add_subplot()
    for s in chart.series:
        style = _STYLE[s.kind]
        if s.kind == "noise" and len(s.x) == 1:
            ax.axhline(s.y[0], label=s.label, gid=s.gid, **style)
        else:
            ax.plot(s.x, s.y, label=s.label, gid=s.gid, **style)
    ax.set_title(chart.title)
    ax.set_xlabel(chart.xlabel)
    ax.set_ylabel(chart.ylabel)
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best")
    return fig


def _metadata(suffix: str) -> dict[str, Any]:
    return {"Date": None} if suffix == ".svg" else {}


def _svg_text(fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=_metadata(".svg"))
    text = buf.getvalue()
    return text[text.index("<svg") :]  # without the XML declaration and doctype


def _html(chart: Chart, svg: str) -> str:
    """A standalone HTML page with the SVG inline (no script, no external file)."""
    title = html.escape(chart.title)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{title}</title>\n</head>\n<body>\n<figure>\n{svg}\n"
        f"<figcaption>{title}</figcaption>\n</figure>\n</body>\n</html>\n"
    )

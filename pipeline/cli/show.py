"""The ``dplr show`` command (registered by :mod:`pipeline.cli.main`).

``dplr show RELEASE`` prints the summary of a published release -- a
factorization (``dplr factorize``), a PCA (``dplr pca``), a stream epoch's release
(``dplr stream release``, ``dplr nightly``) or, given a stream state directory,
its latest released epoch (``--epoch N`` for another) -- from its stored report;
``--json`` prints that report; ``--plot FILE`` draws the released spectrum against
the noise level (and against the true spectrum when the input was written by
``dplr generate``), or, for a stream, the spectrum across its released epochs.

Everything shown is released or public: the report, the released arrays'
shapes and values, and the ``dplr generate`` attributes of a synthetic input,
which only the picture uses (a true spectrum is never printed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from pipeline.cli import plot
from pipeline.cli.common import EXIT_OK, ledger_lines
from pipeline.errors import InvalidParameterError, StoreLayoutError
from pipeline.jobs.locations import redact

#: Released values printed in the summary, at most (the picture shows them all).
SHOWN_VALUES = 10


def add_parser(sub: Any) -> None:
    """Add ``show`` to ``sub``; it dispatches to :func:`run`."""
    s = sub.add_parser(
        "show",
        help="summary of a release: what, privacy, cost, signal above the noise; --plot",
        description=(
            "Print the summary of a release that dplr published (a factorization, "
            "a PCA, a stream epoch's release, or a stream state's latest released "
            "epoch): what was released, the privacy contract, the cost, how many "
            "components stand above the noise, sizes and timings. Reads the "
            "release (and, for --plot, the attributes of a dplr generate input), "
            "never the data; nothing is charged."
        ),
    )
    s.add_argument(
        "release",
        metavar="RELEASE",
        help="a release's Zarr group, or a stream state directory (its latest epoch)",
    )
    s.add_argument(
        "--epoch",
        type=int,
        help="with a stream state: show this released epoch instead of the latest",
    )
    s.add_argument(
        "--json", action="store_true", help="print the stored report as JSON"
    )
    s.add_argument(
        "--plot",
        metavar="FILE",
        help="draw the released spectrum against the noise level (and the true "
        "spectrum of a dplr generate input; a stream's across epochs) to FILE: "
        ".png, .svg or .html (needs pip install 'dplr[plot]')",
    )
    s.set_defaults(handler=run)


@dataclasses.dataclass(frozen=True)
class StreamView:
    """The released epochs of a stream state and the one shown."""

    state: str
    stream_id: str
    epoch: int
    #: every released epoch and where its release was published
    released: dict[int, str]


@dataclasses.dataclass(frozen=True)
class Shown:
    """A release read for display: where from, its report and arrays (unread)."""

    path: str
    report: dict[str, Any]
    arrays: dict[str, Any]
    stream: StreamView | None = None

    @property
    def pca(self) -> bool:
        return "eigenvalues" in self.arrays

    @property
    def spectrum_name(self) -> str:
        return "eigenvalues" if self.pca else "S"

    def spectrum(self) -> list[float]:
        """The released singular values (or a PCA's eigenvalues), read now."""
        return _floats(self.arrays[self.spectrum_name])


def _floats(stored: Any) -> list[float]:
    """A released 1-D array's values (numpy stays off the import path of ``dplr``)."""
    return [float(x) for x in stored[...].tolist()]


def run(args: argparse.Namespace) -> int:
    """``dplr show``: the summary (or ``--json`` report) of a release, and its picture."""
    target = None if args.plot is None else plot.check_plot_path(args.plot)
    shown = load(args.release, args.epoch)
    plot_line = None if target is None else _draw(shown, target)
    if args.json:
        print(json.dumps(shown.report, indent=2))
        return EXIT_OK
    print(summary(shown, plot_line))
    return EXIT_OK


def load(path: str, epoch: int | None = None) -> Shown:
    """The release at ``path``, or a stream state's epoch ``epoch`` (default: latest).

    Raises
    ------
    StoreLayoutError
        ``path`` is neither a release nor a stream state.
    InvalidParameterError
        ``epoch`` was not released, or is given for a single release.
    """
    from pipeline.jobs import data as stores  # heavy: zarr, kept off `dplr --help`

    if stores.is_stream_state(path):
        return _load_stream(path, epoch)
    if epoch is not None:
        raise InvalidParameterError(
            f"--epoch applies to a stream state (made by dplr stream init); "
            f"{redact(path)!r} is not one."
        )
    report, arrays = stores.open_published(path)
    return Shown(path=path, report=report, arrays=arrays)


def _load_stream(state: str, epoch: int | None) -> Shown:
    from pipeline.jobs import data as stores  # heavy: zarr, kept off `dplr --help`

    m = stores.StreamStore.open(state).manifest
    released = {int(e): r["out"] for e, r in m["releases"].items()}
    listed = ", ".join(str(e) for e in sorted(released))
    if not released:
        raise InvalidParameterError(
            f"the stream {state!r} has no released epoch yet; publish one with "
            "dplr stream release STATE --epoch N --out OUT."
        )
    chosen = max(released) if epoch is None else epoch
    if chosen not in released:
        raise InvalidParameterError(
            f"epoch {chosen} of the stream {state!r} was not released; "
            f"released epochs: {listed}."
        )
    report, arrays = stores.open_published(released[chosen])
    view = StreamView(state=state, stream_id=m["stream_id"], epoch=chosen,
                      released=dict(sorted(released.items())))  # fmt: skip
    return Shown(path=released[chosen], report=report, arrays=arrays, stream=view)


# -- the summary ---------------------------------------------------------------


def _row(key: str, value: str) -> str:
    return f"  {key + ':':<11}{value}"


def summary(shown: Shown, plot_line: str | None = None) -> str:
    """The human summary of a release (what ``dplr show`` prints)."""
    rep = shown.report
    lines = [_header(shown), _row("kind", _kind(shown))]
    lines.append(_row("released", _sizes(shown)))
    lines.append(_row("spectrum", _values(shown)))
    lines.append(_row("input", _input(shown)))
    lines.append(_row("privacy", _privacy(rep)))
    lines.append(_row("cost", _cost(rep)))
    noise = _noise(rep)
    if noise:
        lines.append(_row("noise", noise))
    lines.extend(_signal(rep))
    if rep.get("note"):
        lines.append(_row("note", rep["note"]))
    sel = rep.get("selection")
    if isinstance(sel, dict):
        lines.append(_row("selection", _selection(sel)))
    passes = rep.get("n_passes")
    lines.append(_row("passes", "not recorded" if passes is None else str(passes)))
    lines.append(_row("timings", _timings(rep)))
    lines.append(_row("id", _identity(rep)))
    if plot_line is not None:
        lines.append(_row("plot", plot_line))
    return "\n".join(lines)


def _header(shown: Shown) -> str:
    s = shown.stream
    if s is None:
        return f"release read from {redact(shown.path)}"
    return (
        f"stream state {s.state}: epoch {s.epoch}, read from {shown.path}; "
        f"released epochs: {', '.join(str(e) for e in s.released)}"
    )


def _kind(shown: Shown) -> str:
    rep = shown.report
    k, p = rep.get("rank"), rep.get("parameters", {})
    if shown.pca:
        what = "centred PCA subspace" if p.get("centred") else "PCA subspace"
        return f"{what} ({p.get('method')}), rank {k}"
    st = rep.get("stream")
    if st is not None:
        return (
            f"epoch {st['epoch']} of {st['horizon']} of stream {st['stream_id']}: "
            f"factorization ({rep['algorithm']}), rank {k}"
        )
    return f"factorization ({rep.get('algorithm')}), rank {k}"


def _sizes(shown: Shown) -> str:
    parts = [f"{n} {tuple(a.shape)}" for n, a in _in_order(shown.arrays).items()]
    nbytes = sum(int(a.nbytes) for a in shown.arrays.values())
    dtypes = sorted({str(a.dtype) for a in shown.arrays.values()})
    return f"{', '.join(parts)}: {_bytes(nbytes)} as {'/'.join(dtypes)}"


def _in_order(arrays: dict[str, Any]) -> dict[str, Any]:
    """The arrays in the order the release names them (U, S, V; components, eigenvalues)."""
    order = ("U", "S", "V", "components", "eigenvalues")
    known = [n for n in order if n in arrays]
    return {n: arrays[n] for n in (*known, *sorted(set(arrays) - set(known)))}


def _bytes(n: int) -> str:
    if n < 1000:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KB", "MB", "GB"):
        size /= 1000
        if size < 1000 or unit == "GB":
            break
    return f"{size:.1f} {unit}"


def _values(shown: Shown) -> str:
    v = shown.spectrum()
    text = ", ".join(f"{x:.4g}" for x in v[:SHOWN_VALUES])
    more = f", ... ({len(v)} in all)" if len(v) > SHOWN_VALUES else ""
    noisy = "noisy" if shown.report.get("epsilon") is not None else "no noise"
    return f"{shown.spectrum_name} = [{text}{more}] (released, {noisy})"


def _input(shown: Shown) -> str:
    rep = shown.report
    m, n = rep.get("shape", ("?", "?"))
    if shown.stream is not None or "stream" in rep:
        return f"turnstile updates to a {m} x {n} matrix"
    info = rep.get("input") or {}
    where = info.get("path") or "an in-memory array"
    return f"{where} ({m} x {n}, {info.get('dtype', 'dtype not recorded')})"


def _privacy(rep: dict[str, Any]) -> str:
    if rep.get("epsilon") is None:
        return "NOT PRIVATE: a non-private run (no clipping, no noise)"
    pair = f"({rep['epsilon']:g}, {rep['delta']:g})-DP"
    if "privacy_unit" in rep:  # a factorization or a stream
        text = (
            f"{pair} for one {rep['privacy_unit']} under {rep['neighboring']} "
            f"neighbours, clip norm {rep['clip_norm']:g}"
        )
        if "stream" in rep:
            text += " for the whole stream (every epoch's release together)"
    else:  # a PCA: its report words the relation
        text = f"{pair} for {rep['neighboring']}"
    if not rep.get("private", False):
        text += "; NOT PRIVATE: noise drawn from --insecure-noise-seed"
    return text


def _cost(rep: dict[str, Any]) -> str:
    if rep.get("epsilon") is None:
        return "nothing charged (not private)"
    led = rep.get("ledger")
    if isinstance(led, dict) and "stream" in rep:
        return (
            f"the stream's (epsilon={rep['epsilon']:g}, delta={rep['delta']:g}), charged "
            f"once at its creation to the ledger {led.get('path')}; an epoch costs nothing more"
        )
    pair = f"(epsilon={rep['epsilon']:g}, delta={rep['delta']:g})"
    if not isinstance(led, dict):
        return f"{pair}; no ledger recorded"
    if led.get("kind") != "file":
        return f"{pair}; {' '.join(ledger_lines(rep)).strip()}"
    # the ledger as it stood after this release: later releases compose since
    return (
        f"{pair}, charged to the ledger {led['path']} (lifetime budget epsilon="
        f"{led['budget_epsilon']:g}, delta={led['budget_delta']:g} for one {led['unit']}); "
        f"after it, {led['n_releases']} release(s) composed to epsilon="
        f"{led['epsilon_used']:.4g} at the budget's delta"
    )


def _noise(rep: dict[str, Any]) -> str:
    if rep.get("epsilon") is None:
        return ""
    parts = [
        f"{s['name']} {tuple(s['shape'])} sigma={s['sigma']:.4g}"
        for s in rep.get("sketches") or ()
    ]
    parts += [
        f"{m['label']} x{m['count']} {tuple(m['shape'])} sigma={m['sigma']:.4g}"
        for m in rep.get("mechanisms") or ()
    ]
    std = (rep.get("stream") or {}).get("noise_std")
    if std:
        parts.append(
            "per-entry std this epoch "
            + ", ".join(f"{k}={v:.4g}" for k, v in std.items())
        )
    return "; ".join(parts)


def _signal(rep: dict[str, Any]) -> list[str]:
    """The components above the noise, as the report records them."""
    sig = rep.get("signal")
    if not isinstance(sig, dict):
        return [
            _row(
                "signal",
                "above the noise: not recorded (the report has no signal record)",
            )
        ]
    conf = sig.get("confidence")
    lines = [
        _row(
            "signal",
            f"{sig.get('above')} of {sig.get('of')} components stand above the noise "
            f"level {_number(sig.get('noise_level'))}"
            + ("" if conf is None else f" (confidence {conf:g})"),
        )
    ]
    if sig.get("advice"):
        lines.append(_row("advice", str(sig["advice"])))
    return lines


def _selection(sel: dict[str, Any]) -> str:
    """What a private selection chose (its number of trials is never recorded)."""
    if not sel.get("warm_start_gap_test_passed", True):
        return "the Analyze Gauss estimate (the power method's start was not separated enough)"
    if sel.get("selected_iterations") == 0:
        return "Analyze Gauss"
    return (
        f"the power method with R={_number(sel.get('selected_clip_radius'))}, "
        f"T={sel.get('selected_iterations')}"
    )


def _number(x: Any) -> str:
    return f"{x:.4g}" if isinstance(x, (int, float)) else str(x)


def _timings(rep: dict[str, Any]) -> str:
    t = rep.get("timings_seconds")
    if t is None:
        return "not recorded"
    if not t:
        # a private selection's durations would reveal its number of trials, a
        # sparse input's its number of stored entries (docs/privacy.md, "Times")
        return (
            "withheld (they would reveal a private selection's trials or a sparse "
            "input's stored entries)"
        )
    return ", ".join(f"{k} {v:.2f} s" for k, v in t.items())


def _identity(rep: dict[str, Any]) -> str:
    version = (rep.get("versions") or {}).get("dplr", "?")
    return f"{rep.get('release_id')}, created {rep.get('created')}, dplr {version}"


# -- the picture ---------------------------------------------------------------


def _draw(shown: Shown, target: str) -> str:
    """Draw ``shown`` to ``target``; the summary's line about what was drawn."""
    chart, notes = stream_chart(shown) if shown.stream else release_chart(shown)
    plot.write_chart(target, chart)
    drawn = [s.label.split(" (")[0] for s in chart.series if s.kind != "released"]
    what = (
        f"{chart.ylabel} across epochs {', '.join(str(e) for e in shown.stream.released)}"
        if shown.stream
        else f"released {chart.ylabel}"
    )
    return f"{target} ({', '.join([what, *drawn])}{''.join('; ' + n for n in notes)})"


def _noise_level(rep: dict[str, Any]) -> float | None:
    sig = rep.get("signal")
    level = sig.get("noise_level") if isinstance(sig, dict) else None
    return float(level) if isinstance(level, (int, float)) else None


def release_chart(shown: Shown) -> tuple[plot.Chart, list[str]]:
    """The released spectrum against the noise level and, for an input that
    ``dplr generate`` wrote, the true spectrum; and notes on what is missing."""
    rep, v = shown.report, shown.spectrum()
    name = "eigenvalues" if shown.pca else "singular values"
    x = tuple(float(i) for i in range(1, len(v) + 1))
    series = [plot.Series(f"released {name}", "released-spectrum", x, tuple(v))]
    notes = []
    truth = true_spectrum(shown)
    if truth is None:
        where = (rep.get("input") or {}).get("path")
        notes.append(
            "no true spectrum: "
            + (
                "the input was not a stored matrix"
                if where is None
                else f"{where} is not here, or dplr generate did not write it"
            )
        )
    else:
        n = min(len(truth), max(2 * len(v), len(v) + 5))
        tx = tuple(float(i) for i in range(1, n + 1))
        series.append(plot.Series(f"true {name} (generated input)", "true-spectrum",
                                  tx, tuple(truth[:n]), "truth"))  # fmt: skip
    level = _noise_level(rep)
    if level is None:
        notes.append("no noise level: not recorded in the report")
    else:
        series.append(
            plot.Series("noise level", "noise-level", (1.0,), (level,), "noise")
        )
    title = f"{_kind(shown)}: released {name}"
    chart = plot.Chart(
        title=title, xlabel="component", ylabel=name, series=tuple(series)
    )
    return chart, notes


def true_spectrum(shown: Shown) -> list[float] | None:
    """The true spectrum of the release's input, when ``dplr generate`` wrote it.

    Singular values for a factorization; for a PCA, the eigenvalues of ``A^T A``
    after the rows are divided by the public row-norm bound C, ``(sigma / C)^2``.
    Both are the input's, before clipping (equal to the clipped input's when no
    row exceeds the clip norm). None when the input is gone, of another shape, or
    from another writer.
    """
    from pipeline.jobs import data as stores  # heavy: zarr, kept off `dplr --help`

    rep = shown.report
    path = (rep.get("input") or {}).get("path")
    truth = stores.synthetic_truth(path)
    if truth is None or list(truth["shape"]) != list(rep.get("shape", [])):
        return None
    sigma = [float(x) for x in truth["singular_values"]]
    if not shown.pca:
        return sigma
    c = float(rep.get("parameters", {}).get("row_norm_bound") or 1.0)
    return [(x / c) ** 2 for x in sigma]


def stream_chart(shown: Shown) -> tuple[plot.Chart, list[str]]:
    """Each released singular value of a stream across its released epochs, and
    the noise level of each epoch where its report records one."""
    from pipeline.jobs import data as stores  # heavy: zarr, kept off `dplr --help`

    assert shown.stream is not None
    epochs, spectra, levels, notes = [], [], [], []
    for epoch, out in shown.stream.released.items():
        try:
            rep, arrays = stores.open_published(out)
        except StoreLayoutError:
            notes.append(f"epoch {epoch}'s release {out} is missing")
            continue
        epochs.append(float(epoch))
        spectra.append(_floats(arrays["S"]))
        level = _noise_level(rep)
        levels.append(math.nan if level is None else level)
    if not spectra:
        raise StoreLayoutError(
            f"none of the releases of the stream {shown.stream.state!r} exists any more."
        )
    x = tuple(epochs)
    k = min(len(s) for s in spectra)
    series = [
        plot.Series(f"$\\sigma_{{{i + 1}}}$", f"component-{i + 1}", x,
                    tuple(float(s[i]) for s in spectra))
        for i in range(k)
    ]  # fmt: skip
    if all(math.isnan(v) for v in levels):
        notes.append("no noise level: not recorded in the reports")
    else:
        series.append(
            plot.Series("noise level", "noise-level", x, tuple(levels), "noise")
        )
    title = f"stream {shown.stream.stream_id}: released singular values"
    chart = plot.Chart(title=title, xlabel="epoch", ylabel="singular values",
                       series=tuple(series))  # fmt: skip
    return chart, notes

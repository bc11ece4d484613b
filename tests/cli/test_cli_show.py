"""``dplr show RELEASE``: the summary of a release, its stored report, its picture.

Every kind of release dplr writes is made for real (``dplr factorize`` and ``dplr
pca`` as subprocesses on the session's cluster, a stream through its API) at the
smallest sizes the other CLI tests use, then shown by ``dplr show`` as a
subprocess; refusals that happen before anything is read run in process
(:func:`cli_util.run_in_process`, the same parser, exit codes and stderr line).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from cli_util import assert_one_line_error, run_dplr, run_in_process

from pipeline.cli import show
from pipeline.io import read_group, read_release
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import stream_ingest, stream_init, stream_release

# runs without --scheduler go to the session's cluster (tests/conftest.py)
pytestmark = [pytest.mark.cli, pytest.mark.usefixtures("cli_cluster")]

ROWS, COLS, RANK = 2000, 60, 3  # as tests/cli/test_cli_factorize.py
PCA_SAMPLE = Path(__file__).resolve().parents[2] / "data" / "pca_sample.zarr"
STREAM_SHAPE = (240, 160)  # as tests/cli/test_cli_stream.py
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")
BUDGET = ("--budget-epsilon", "10", "--budget-delta", "1e-4")
#: The size of every picture (pipeline.cli.plot.FIGURE_PIXELS), as (height, width).
PNG_SHAPE = (500, 800)
SVG = "{http://www.w3.org/2000/svg}"
#: A signal record of the form every report carries (pipeline's "signal" key).
SIGNAL = {
    "noise_level": 3.25,
    "confidence": 0.95,
    "above": 1,
    "of": 3,
    "advice": "a larger epsilon, a smaller k or more rows would lift more above the noise",
}


def _factorize(store: Path, out: Path, scheduler: str) -> None:
    proc = run_dplr(
        "factorize", store, "--rank", RANK, "--out", out, *PRIVACY, *BUDGET,
        "--scheduler", scheduler, "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def releases(
    tmp_path_factory: pytest.TempPathFactory, shared_scheduler: str
) -> dict[str, Path]:
    """A factorization of a generated store (true spectrum in its attributes), the
    same release with a store without those attributes as its input, and a PCA of
    the generated sample."""
    work = tmp_path_factory.mktemp("show")
    generated = work / "A.zarr"
    proc = run_dplr(
        "generate", generated, "--rows", ROWS, "--cols", COLS, "--chunks", "500,-1",
        "--seed", 3,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the same matrix, stored by another writer: no dplr_synthetic attributes
    plain = work / "plain.zarr"
    a = zarr.open_array(store=generated, mode="r")
    zarr.create_array(store=plain, data=np.asarray(a[...]), chunks=(500, COLS))
    pca_in = work / "pca_sample.zarr"
    shutil.copytree(PCA_SAMPLE, pca_in)
    _factorize(generated, work / "f.zarr", shared_scheduler)
    # the same release as if its input were the plain store (one run fewer)
    moved = dict(read_release(work / "f.zarr", load=False).report["input"], path=str(plain))
    _with_report(work / "f.zarr", work / "plain-f.zarr", {"input": moved})
    proc = run_dplr(
        "pca", pca_in, "--rank", 2, "--out", work / "p.zarr", *PRIVACY, *BUDGET,
        "--scheduler", shared_scheduler, "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return {
        "factorize": work / "f.zarr",
        "plain": work / "plain-f.zarr",
        "pca": work / "p.zarr",
        "input": generated,
    }


def _batch(path: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    i = rng.integers(0, STREAM_SHAPE[0], 500)
    j = rng.integers(0, STREAM_SHAPE[1], 500)
    write_batch(path, {"entity": i, "i": i, "j": j, "s": rng.normal(size=500) * 0.05})


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, Path]]:
    """A private stream with epochs 1 and 2 released (in this process: no cluster)."""
    work = tmp_path_factory.mktemp("stream")
    state = work / "s.stream"
    stream_init(
        state, n_rows=STREAM_SHAPE[0], n_cols=STREAM_SHAPE[1], rank=RANK, horizon=4,
        epsilon=1.0, delta=1e-6, unit="row", ledger=work / "population.dplr-ledger.json",
        budget=(1.0, 1e-6),
    )  # fmt: skip
    outs = {}
    for epoch in (1, 2):
        _batch(work / f"b{epoch}.npz", epoch)
        stream_ingest(state, work / f"b{epoch}.npz", epoch=epoch)
        outs[epoch] = work / f"r{epoch}.zarr"
        stream_release(state, epoch=epoch, out=outs[epoch])
    return state, outs


def _with_report(src: Path, dst: Path, change: dict[str, Any]) -> Path:
    """A copy of the release ``src`` whose report has ``change`` applied (a value
    None removes the key): a release as another version of dplr wrote it."""
    shutil.copytree(src, dst)
    g = zarr.open_group(store=dst, mode="r+")
    report = dict(g.attrs["report"])
    for key, value in change.items():
        if value is None:
            report.pop(key, None)
        else:
            report[key] = value
    g.attrs["report"] = report
    return dst


# -- the summary -------------------------------------------------------------


def test_show_factorization(releases: dict[str, Path]) -> None:
    proc = run_dplr("show", releases["factorize"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    rep = read_release(releases["factorize"]).report
    assert "factorization (two-pass), rank 3" in out
    assert f"U ({ROWS}, {RANK}), S ({RANK},), V ({COLS}, {RANK})" in out
    assert "(1, 1e-06)-DP for one row under add-remove neighbours, clip norm 1" in out
    assert rep["ledger"]["path"] in out
    assert "passes:    2" in out
    assert re.search(r"timings:   plan \d+\.\d\d s, pass \d+\.\d\d s", out)
    assert rep["release_id"] in out
    # the released (noisy) spectrum is printed; the true one never (a non-private
    # statistic of the data, even though this store is synthetic)
    truth = zarr.open_array(store=releases["input"], mode="r").attrs["dplr_synthetic"]
    top = [float(s) for s in truth["singular_values"][: RANK + 3]]
    printed = set(re.findall(r"\d+\.\d+", out))
    shown_truth = {f"{s:.{d}g}" for s in top for d in (3, 4)} | {repr(s) for s in top}
    assert not printed & shown_truth
    assert proc.stderr == ""


def test_show_signal_when_recorded_and_not_recorded(
    releases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_signal = _with_report(releases["factorize"], tmp_path / "s.zarr", {"signal": SIGNAL})
    out = run_in_process(capsys, "show", with_signal).stdout
    assert "1 of 3 components stand above the noise level 3.25 (confidence 0.95)" in out
    assert SIGNAL["advice"] in out
    # negative control: a report without the record says so instead of guessing
    without = _with_report(releases["factorize"], tmp_path / "n.zarr", {"signal": None})
    out = run_in_process(capsys, "show", without).stdout
    assert "above the noise: not recorded" in out
    assert "stand above" not in out


def test_show_pca(releases: dict[str, Path]) -> None:
    proc = run_dplr("show", releases["pca"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "PCA subspace (analyze-gauss), rank 2" in out
    assert "components (16, 2), eigenvalues (3,)" in out
    assert "(1, 1e-06)-DP for one row present or a zero row" in out
    assert "M x1 (16, 16)" in out
    assert "eigenvalues = [" in out


def test_show_stream_latest_and_chosen_epoch(
    stream: tuple[Path, dict[int, Path]], capsys: pytest.CaptureFixture[str]
) -> None:
    state, outs = stream
    proc = run_dplr("show", state)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 2 of 4 of stream" in proc.stdout
    assert "released epochs: 1, 2" in proc.stdout
    assert f"read from {outs[2]}" in proc.stdout
    assert "for the whole stream" in proc.stdout
    proc = run_in_process(capsys, "show", state, "--epoch", 1)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1 of 4 of stream" in proc.stdout
    assert f"read from {outs[1]}" in proc.stdout
    # an epoch's own release shows the same
    proc = run_in_process(capsys, "show", outs[1])
    assert "epoch 1 of 4 of stream" in proc.stdout


# -- --json ------------------------------------------------------------------


def test_json_round_trips(
    releases: dict[str, Path],
    stream: tuple[Path, dict[int, Path]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = run_dplr("show", releases["factorize"], "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == read_release(releases["factorize"]).report
    _, pca_report = read_group(releases["pca"], ())
    assert json.loads(run_in_process(capsys, "show", releases["pca"], "--json").stdout) == pca_report
    state, outs = stream
    for args, epoch in (((), 2), (("--epoch", "1"), 1)):
        shown = json.loads(run_in_process(capsys, "show", state, "--json", *args).stdout)
        assert shown == read_release(outs[epoch]).report


# -- --plot ------------------------------------------------------------------


def _png_checked(path: Path) -> np.ndarray:
    """The picture at ``path``: the documented size, and not blank."""
    import matplotlib.image

    img = matplotlib.image.imread(path)
    assert img.shape[:2] == PNG_SHAPE
    pixels = img[..., :3].reshape(-1, 3)
    assert float(pixels.var()) > 0
    assert len(np.unique(pixels, axis=0)) > 2  # background, axes and data colours
    return img


def _svg_ids(path: Path) -> set[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return {el.get("id", "") for el in root.iter()}


def test_plot_png_with_and_without_generated_truth(
    releases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "f.png"
    proc = run_dplr("show", releases["factorize"], "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert f"{png} (released singular values, true singular values" in proc.stdout
    _png_checked(png)
    # negative control: a store without dplr generate's attributes has no truth
    png = tmp_path / "plain.png"
    proc = run_in_process(capsys, "show", releases["plain"], "--plot", png)
    assert proc.returncode == 0, proc.stderr
    assert "true singular values" not in proc.stdout.split("plot:")[1]
    assert "no true spectrum" in proc.stdout
    _png_checked(png)


def test_plot_svg_marks_each_series(
    releases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with_signal = _with_report(releases["factorize"], tmp_path / "s.zarr", {"signal": SIGNAL})
    proc = run_in_process(capsys, "show", with_signal, "--plot", tmp_path / "s.svg")
    assert proc.returncode == 0, proc.stderr
    ids = _svg_ids(tmp_path / "s.svg")
    assert {"released-spectrum", "noise-level", "true-spectrum"} <= ids
    # the same release without a recorded noise level, of a store without truth
    no_signal = _with_report(releases["plain"], tmp_path / "n.zarr", {"signal": None})
    assert run_in_process(capsys, "show", no_signal, "--plot", tmp_path / "n.svg").returncode == 0
    ids = _svg_ids(tmp_path / "n.svg")
    assert "released-spectrum" in ids
    assert not {"noise-level", "true-spectrum"} & ids


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)


def test_plot_html_embeds_the_svg(
    releases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    html = tmp_path / "p.html"
    proc = run_in_process(capsys, "show", releases["pca"], "--plot", html)
    assert proc.returncode == 0, proc.stderr
    assert "released eigenvalues, true eigenvalues" in proc.stdout
    text = html.read_text(encoding="utf-8")
    parser = _Collect()
    parser.feed(text)
    assert parser.tags[:1] == ["html"]
    assert "svg" in parser.tags
    svg = text[text.index("<svg") : text.index("</svg>") + len("</svg>")]
    ids = {el.get("id", "") for el in ET.fromstring(svg).iter()}
    assert {"released-spectrum", "true-spectrum"} <= ids


def test_plot_stream_across_epochs(
    stream: tuple[Path, dict[int, Path]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state, _ = stream
    proc = run_in_process(capsys, "show", state, "--plot", tmp_path / "s.png")
    assert proc.returncode == 0, proc.stderr
    assert "singular values across epochs 1, 2" in proc.stdout
    _png_checked(tmp_path / "s.png")
    assert run_in_process(capsys, "show", state, "--plot", tmp_path / "s.svg").returncode == 0
    ids = _svg_ids(tmp_path / "s.svg")
    assert {f"component-{i}" for i in range(1, RANK + 1)} <= ids


# -- refusals, each in one line -----------------------------------------------


def test_not_a_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zarr.create_array(store=tmp_path / "a.zarr", data=np.zeros((3, 3)))
    (tmp_path / "empty").mkdir()
    proc = run_dplr("show", tmp_path / "a.zarr")
    line = assert_one_line_error(proc, 2, "dplr: error:")
    assert "is not a dplr release" in line
    for path in (tmp_path / "empty", tmp_path / "missing.zarr"):
        line = assert_one_line_error(run_in_process(capsys, "show", path), 2, "dplr: error:")
        assert "dplr release" in line or "does not exist" in line


def test_unknown_epoch(
    stream: tuple[Path, dict[int, Path]],
    releases: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    state, _ = stream
    line = assert_one_line_error(run_in_process(capsys, "show", state, "--epoch", 3), 2, "dplr: error:")
    assert "epoch 3" in line
    assert "released epochs: 1, 2" in line
    line = assert_one_line_error(
        run_in_process(capsys, "show", releases["pca"], "--epoch", 1), 2, "dplr: error:"
    )
    assert "--epoch" in line


def test_bad_plot_paths_refused_before_reading(
    releases: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = {
        "x.jpg": "unknown plot format '.jpg'",
        "missing/x.png": "does not exist",
        "file.txt/x.png": "does not exist",
    }
    (tmp_path / "file.txt").write_text("")
    for name, message in cases.items():
        # a missing release: the plot path is checked first, so its error is the one
        for target in (releases["factorize"], tmp_path / "no-release.zarr"):
            line = assert_one_line_error(
                run_in_process(capsys, "show", target, "--plot", tmp_path / name), 2, "dplr: error:"
            )
            assert message in line, (name, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_missing_matplotlib_names_the_extra(
    releases: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    line = assert_one_line_error(
        run_in_process(capsys, "show", releases["factorize"], "--plot", tmp_path / "x.png"),
        2, "dplr: error:",
    )  # fmt: skip
    assert "pip install 'dplr[plot]'" in line
    assert not (tmp_path / "x.png").exists()
    # the summary needs no matplotlib
    assert run_in_process(capsys, "show", releases["factorize"]).returncode == 0


def test_stream_chart_draws_each_epochs_recorded_noise_level(
    stream: tuple[Path, dict[int, Path]], tmp_path: Path
) -> None:
    """The noise level of the epochs whose report records one; a gap elsewhere."""
    state, outs = stream
    copies = {
        1: _with_report(outs[1], tmp_path / "r1.zarr", {"signal": None}),
        2: _with_report(outs[2], tmp_path / "r2.zarr", {"signal": SIGNAL}),
    }
    view = show.StreamView(state=str(state), stream_id="s", epoch=2,
                           released={e: str(p) for e, p in copies.items()})  # fmt: skip
    shown = show.load(str(copies[2]))
    chart, notes = show.stream_chart(dataclasses.replace(shown, stream=view))
    noise = [s for s in chart.series if s.gid == "noise-level"]
    assert len(noise) == 1
    assert noise[0].x == (1.0, 2.0)
    assert np.isnan(noise[0].y[0])
    assert noise[0].y[1] == SIGNAL["noise_level"]
    assert notes == []
    # negative control: no epoch records one, so none is drawn and the note says so
    copies[2] = _with_report(outs[2], tmp_path / "n2.zarr", {"signal": None})
    view = dataclasses.replace(view, released={e: str(p) for e, p in copies.items()})
    chart, notes = show.stream_chart(dataclasses.replace(shown, stream=view))
    assert "noise-level" not in {s.gid for s in chart.series}
    assert notes == ["no noise level: not recorded in the reports"]

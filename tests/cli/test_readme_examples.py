"""Every code example of README.md runs as written, in order, in one directory.

The README's bash and python blocks are one session: the Quick start's store is
the one the Python example factorizes, the PCA store the one ``DPPCA`` fits, the
stream the one ``dplr nightly`` drives. Each block runs as a new user would run it
(``dplr`` on the PATH, a fresh interpreter for Python), after the blocks above it.
Only the two installation blocks are not run here: they create a virtual
environment and install the package (``.ci/run`` runs the second one on a clean
clone); they are pinned below, so that a change to them fails this test.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

README = Path(__file__).resolve().parents[2] / "README.md"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)

#: Blocks not run here, pinned by their exact text.
INSTALL_BLOCKS = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install . && dplr demo\n",
    (
        'python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[test]" '
        "&& python -m pytest -q\n"
    ),
)

pytestmark = pytest.mark.cli


def readme_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced bash or python block, in order."""
    return [(m[1], m[2]) for m in _FENCE.finditer(text) if m[1] in ("bash", "python")]


def _batch(path: Path) -> None:
    """``batch.parquet``: the day's updates the stream example ingests (user data)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    m = 5000
    rows = rng.integers(0, 100_000, m)
    table = pa.table(
        {
            "entity": rows,  # unit row: an entity is a row
            "i": rows,
            "j": rng.integers(0, 50_000, m),
            "s": rng.normal(size=m),
        }
    )
    pq.write_table(table, path)


def _run(lang: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    # the dplr of this interpreter's environment, as after the README's install
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    argv = (
        ["bash", "-euo", "pipefail", "-c", code]
        if lang == "bash"
        else [sys.executable, "-c", code]
    )
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=900, check=False
    )


def test_the_readme_has_the_examples_this_test_expects() -> None:
    blocks = readme_blocks(README.read_text())
    codes = [c for _, c in blocks]
    for install in INSTALL_BLOCKS:
        assert install in codes, "an installation block changed: update INSTALL_BLOCKS"
    assert sum(lang == "python" for lang, _ in blocks) >= 2
    assert any("dplr nightly" in c for c in codes)
    assert any("dplr pca" in c for c in codes)


def test_block_parser_finds_a_failing_example(tmp_path: Path) -> None:
    """Negative control: an example that fails is reported as failing."""
    (lang, code), = readme_blocks("text\n```python\nres.U\n```\n")
    proc = _run(lang, code, tmp_path)
    assert proc.returncode != 0
    assert "NameError" in proc.stderr


@pytest.mark.timeout(1500)
def test_every_readme_example_runs_as_written(tmp_path: Path) -> None:
    _batch(tmp_path / "batch.parquet")
    for lang, code in readme_blocks(README.read_text()):
        if code in INSTALL_BLOCKS:
            continue
        proc = _run(lang, code, tmp_path)
        assert proc.returncode == 0, (
            f"README {lang} example failed (exit {proc.returncode}):\n{code}\n"
            f"stderr:\n{proc.stderr[-3000:]}"
        )
    # the Quick start's release stands above its noise (and says so)
    report = zarr.open_group(str(tmp_path / "big-release.zarr"), mode="r").attrs["report"]
    assert report["signal"]["above"] >= 1, report["signal"]
    assert report["signal"]["advice"] == ""

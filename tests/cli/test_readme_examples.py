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
import signal
import subprocess
import sys
from pathlib import Path

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


def _run(
    lang: str, code: str, cwd: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run a bash block in ``cwd``; a python block is saved as a script file in a
    directory of its own and run by path (``python SCRIPT``) from ``cwd``, as a
    user runs a saved example: the embedded cluster's worker processes then
    start from a script, not from ``python -c``."""
    env = {k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"}
    # the dplr of this interpreter's environment, as after the README's install
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    if lang == "bash":
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        scripts = cwd.parent / f"{cwd.name}-scripts"
        scripts.mkdir(exist_ok=True)
        script = scripts / f"example_{len(list(scripts.iterdir()))}.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    # a session of its own: on a timeout the whole group goes (a hung example's
    # worker processes included), not only the interpreter
    with subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


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
    ((lang, code),) = readme_blocks("text\n```python\nres.U\n```\n")
    proc = _run(lang, code, tmp_path)
    assert proc.returncode != 0
    assert "NameError" in proc.stderr


def test_an_unguarded_script_fails_in_one_line_that_shows_the_guard(
    tmp_path: Path,
) -> None:
    """The Python example saved as a script without ``if __name__ ==
    "__main__":`` stops before the embedded cluster starts, with one line that
    shows the guard (its worker processes would re-import the script and run the
    call again); the same script with the guard runs (negative control)."""
    call = (
        "res = pipeline.factorize('t.zarr', 2, private=False, seed=0)\n"
        "print('shape', res.U.shape)\n"
    )
    head = "import pipeline\n\n"
    work = tmp_path / "work"
    work.mkdir()
    made = _run(
        "bash", "dplr generate t.zarr --rows 400 --cols 20 --chunks 200,-1", work
    )
    assert made.returncode == 0, made.stderr
    bare = _run("python", head + call, work, timeout=120)
    assert bare.returncode == 1
    last = bare.stderr.strip().splitlines()[-1]
    assert 'if __name__ == "__main__":' in last
    assert "example_0.py, line 3" in last
    assert "Nanny" not in bare.stderr  # no cluster was started
    guarded = (
        head
        + 'if __name__ == "__main__":\n'
        + "".join(f"    {line}\n" for line in call.splitlines())
    )
    ok = _run("python", guarded, work, timeout=180)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "shape (400, 2)" in ok.stdout


@pytest.mark.timeout(1500)
def test_every_readme_example_runs_as_written(tmp_path: Path) -> None:
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

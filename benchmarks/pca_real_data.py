"""Real matrices for the private PCA benchmark, from data installed on this machine.

Nothing is downloaded. Every matrix is prepared the same way (public, per-dataset
preprocessing of the benchmark, not part of any private run): columns centred with
their exact mean (so that the uncentred PCA the package computes is the usual
centred PCA of the data, and diffprivlib's ``centered=True`` PCA has the same
target) and, for the two tables whose columns are in different units (breast
cancer, wine), divided by their standard deviation; then every row divided by its own norm (rows of norm 1; a zero row stays
zero). The ground truth is the exact top-k right singular subspace of the result.

* ``digits``: scikit-learn's 8 x 8 handwritten digits, all 64 pixels (n = 1797).
* ``digits10``: the same images cropped to 10 central pixels (row 3, columns 1-5,
  and row 4, columns 1-5), for diffprivlib's d <= 10.
* ``breast_cancer`` (n = 569, d = 30) and ``wine`` (n = 178, d = 13).
* ``source_bow``: a bag of words of the Python source installed with this
  interpreter: every ``.py`` file of site-packages (sorted by path) cut into
  blocks of 40 lines; a row per block with at least 5 vocabulary tokens; columns
  the 128 identifier tokens (3+ letters, lower-cased) found in most blocks;
  entries ``log(1 + count)``.
"""

from __future__ import annotations

import collections
import os
import re
import sysconfig
from collections.abc import Iterator
from typing import Any

import numpy as np

REAL_DATASETS = ("digits", "digits10", "breast_cancer", "wine", "source_bow")
_TOKEN = re.compile(r"[A-Za-z_]{3,}")
#: Source blocks: lines per row, vocabulary size, minimum tokens per row.
BLOCK_LINES, VOCAB, MIN_TOKENS = 40, 128, 5


def _normalise(X: np.ndarray, standardise: bool = False) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    X = X - X.mean(axis=0)
    if standardise:  # columns in different units
        X = X / X.std(axis=0)
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return np.divide(X, norms, out=np.zeros_like(X), where=norms > 0)


def _sklearn(name: str) -> np.ndarray:
    from sklearn import datasets

    if name in ("digits", "digits10"):
        X = datasets.load_digits().data
        if name == "digits10":
            img = X.reshape(-1, 8, 8)
            X = np.hstack([img[:, 3, 1:6], img[:, 4, 1:6]])
        return X
    loader = {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine}
    return loader[name]().data


def installed_text_blocks(suffixes: tuple[str, ...], block_lines: int) -> Iterator[str]:
    """The lower-cased text of every ``block_lines``-line block of the files under
    site-packages ending in ``suffixes``, in a fixed order (sorted directories and
    names); files that cannot be read as UTF-8 are skipped."""
    root = sysconfig.get_paths()["purelib"]
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in sorted(filenames):
            if not fn.endswith(suffixes):
                continue
            try:
                with open(os.path.join(dirpath, fn), encoding="utf-8") as f:
                    lines = f.readlines()
            except (OSError, UnicodeDecodeError):
                continue
            for i in range(0, len(lines), block_lines):
                yield "".join(lines[i : i + block_lines]).lower()


def _source_blocks() -> list[list[str]]:
    return [_TOKEN.findall(text) for text in installed_text_blocks((".py",), BLOCK_LINES)]


def _source_bow() -> np.ndarray:
    blocks = _source_blocks()
    df: collections.Counter[str] = collections.Counter()
    for toks in blocks:
        df.update(set(toks))
    vocab = [w for w, _ in sorted(df.items(), key=lambda kv: (-kv[1], kv[0]))[:VOCAB]]
    index = {w: j for j, w in enumerate(vocab)}
    rows = []
    for toks in blocks:
        counts = collections.Counter(t for t in toks if t in index)
        if sum(counts.values()) < MIN_TOKENS:
            continue
        r = np.zeros(VOCAB)
        for w, c in counts.items():
            r[index[w]] = c
        rows.append(r)
    return np.log1p(np.array(rows))


def load_real(name: str, cache_dir: str | None = None) -> dict[str, Any]:
    """``{"name", "A" (n x d, rows of norm <= 1), "source"}`` of one real dataset."""
    if name not in REAL_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {REAL_DATASETS}")
    path = None if cache_dir is None else os.path.join(cache_dir, f"pca_real_{name}.npy")
    if path is not None and os.path.exists(path):
        A = np.load(path)
    else:
        raw = _source_bow() if name == "source_bow" else _sklearn(name)
        A = _normalise(raw, standardise=name in ("breast_cancer", "wine"))
        if path is not None:
            os.makedirs(cache_dir, exist_ok=True)  # type: ignore[arg-type]
            np.save(path, A)
    source = (
        "python source of site-packages, 40-line blocks, log(1 + count) of the 128 "
        "commonest identifier tokens"
        if name == "source_bow"
        else f"sklearn.datasets ({name})"
    )
    return {"name": name, "A": A, "source": source}


def top_subspace(A: np.ndarray, k: int) -> np.ndarray:
    """Exact ``V_k`` (d x k) of ``A`` (the benchmark's ground truth)."""
    _, _, Vt = np.linalg.svd(A, full_matrices=False)
    return Vt[:k].T

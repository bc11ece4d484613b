"""A sparse real matrix from data installed on this machine: TF-IDF of the
installed packages' text, kept sparse (scipy CSR).

Nothing is downloaded. ``tfidf_docs``: every ``.py``, ``.rst``, ``.md`` and
``.txt`` file under this interpreter's site-packages (walked in sorted order) is
cut into blocks of ``BLOCK_LINES`` lines; a block is a document. Tokens are the
words of 3+ letters (lower-cased). The vocabulary is the ``VOCAB`` terms found in
the most documents, ties broken alphabetically, among those in at most 5% of
them (the common words of code and prose, ``self``, ``the``, ``return``, say
little about a document, and dropping them keeps the matrix sparse: 42724 x 1000
at 2.9% density here). A document with fewer than ``MIN_TOKENS`` vocabulary tokens is dropped. Entries
are TF-IDF with sublinear term frequency and scikit-learn's smoothed idf,
``(1 + log tf) * (log((1 + N) / (1 + df)) + 1)``, and every row has norm 1
(scikit-learn's ``TfidfVectorizer(sublinear_tf=True)`` on these tokens). Not
centred: centring would densify it, and a factorization needs no centring.

Deterministic: sorted files, fixed vocabulary cap and tie rule; the result
depends only on what is installed. Cached as ``sparse_real_tfidf_docs.npz``.
"""

from __future__ import annotations

import collections
import os
import re
from typing import Any

import numpy as np
import scipy.sparse as sp
from pca_real_data import installed_text_blocks

SPARSE_DATASETS = ("tfidf_docs",)
_TOKEN = re.compile(r"[A-Za-z]{3,}")
SUFFIXES = (".py", ".rst", ".md", ".txt")
#: Lines per document, vocabulary size, minimum vocabulary tokens per document,
#: largest document frequency kept (a fraction of the documents).
BLOCK_LINES, VOCAB, MIN_TOKENS, MAX_DF = 200, 1000, 5, 0.05


def _documents() -> list[collections.Counter[str]]:
    return [
        collections.Counter(_TOKEN.findall(text))
        for text in installed_text_blocks(SUFFIXES, BLOCK_LINES)
    ]


def _tfidf(docs: list[collections.Counter[str]]) -> sp.csr_matrix:
    df: collections.Counter[str] = collections.Counter()
    for counts in docs:
        df.update(counts.keys())
    limit = MAX_DF * len(docs)
    kept = sorted((w for w in df if df[w] <= limit), key=lambda w: (-df[w], w))
    vocab = {w: j for j, w in enumerate(kept[:VOCAB])}
    indptr, indices, tf = [0], [], []
    for counts in docs:
        row = sorted((vocab[w], c) for w, c in counts.items() if w in vocab)
        if sum(c for _, c in row) < MIN_TOKENS:
            continue
        indices.extend(j for j, _ in row)
        tf.extend(c for _, c in row)
        indptr.append(len(indices))
    idx = np.asarray(indices, dtype=np.int64)
    n_docs = len(indptr) - 1
    dfv = np.bincount(idx, minlength=len(vocab))
    idf = np.log((1.0 + n_docs) / (1.0 + dfv)) + 1.0
    data = (1.0 + np.log(np.asarray(tf, dtype=np.float64))) * idf[idx]
    X = sp.csr_matrix((data, idx, np.asarray(indptr)), shape=(n_docs, len(vocab)))
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / norms) @ X)


def load_sparse_real(name: str, cache_dir: str | None = None) -> dict[str, Any]:
    """``{"name", "A" (scipy CSR, rows of norm 1), "source"}`` of one sparse dataset."""
    if name not in SPARSE_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose from {SPARSE_DATASETS}")
    path = (
        None
        if cache_dir is None
        else os.path.join(cache_dir, f"sparse_real_{name}.npz")
    )
    if path is not None and os.path.exists(path):
        A = sp.csr_matrix(sp.load_npz(path))
    else:
        A = _tfidf(_documents())
        if path is not None:
            os.makedirs(cache_dir, exist_ok=True)  # type: ignore[arg-type]
            sp.save_npz(path, A)
    source = (
        f"TF-IDF of the .py/.rst/.md/.txt files of site-packages, {BLOCK_LINES}-line "
        f"blocks, the {VOCAB} commonest terms in at most {MAX_DF:g} of the blocks"
    )
    return {"name": name, "A": A, "source": source}


if __name__ == "__main__":
    a = load_sparse_real("tfidf_docs")["A"]
    print(a.shape, a.nnz, a.nnz / (a.shape[0] * a.shape[1]))

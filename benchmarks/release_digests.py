"""Digests of seeded releases: one line per kind of release, to compare two versions.

A restructuring of the package must leave every release bit for bit as it was. This
script runs one seeded release of each kind (factorize with each algorithm, in memory
and from a Zarr store on the embedded cluster; PCA with each method and with
selection; a centred ``DPPCA`` fit; a stream's epoch release) with a fixed sketch
seed and a fixed, insecure noise seed, and prints the SHA-256 of each release's
arrays. Run it on the same machine, with the same BLAS threads, before and after a
change and compare the outputs (``diff``): the same computation on the same bytes
gives the same bits, so any difference is a change of behaviour.

    python benchmarks/release_digests.py > before.txt
    # ... change the code ...
    python benchmarks/release_digests.py > after.txt
    diff before.txt after.txt
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

import pipeline
from pipeline.io import generate_store
from pipeline.io.batches import write_batch
from pipeline.jobs.stream import stream_ingest, stream_init, stream_release
from pipeline.linalg.synthetic import coherent_matrix

SEED = 20261206
BUDGET = (1000.0, 1e-3)


def digest(*arrays: Any) -> str:
    """SHA-256 over the arrays' dtypes, shapes and bytes (C order)."""
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()[:24]


def _matrix() -> np.ndarray:
    rng = np.random.default_rng(SEED)
    u, _ = np.linalg.qr(rng.standard_normal((400, 12)))
    v, _ = np.linalg.qr(rng.standard_normal((60, 12)))
    A = (u * np.geomspace(30.0, 0.5, 12)) @ v.T
    return A + 0.01 * rng.standard_normal(A.shape)


def _account(work: Path, name: str, stored: bool) -> dict[str, Any]:
    """A ledger of its own for a stored input, an accountant of its own in memory."""
    if stored:
        return {"ledger": work / f"{name}.json", "budget": BUDGET}
    return {"dataset": f"digest-{name}"}


def _factorizations(work: Path) -> Iterator[tuple[str, Callable[[], Any]]]:
    A = _matrix()
    store = work / "A.zarr"
    generate_store(store, 400, 60, chunks=(100, 60), dtype="float64", seed=SEED)
    for algorithm in ("two-pass", "spectral", "low-space"):
        for name, source in (("memory", A), ("zarr", str(store))):
            yield (
                f"factorize {algorithm} {name}",
                lambda s=source, a=algorithm, n=name: pipeline.factorize(
                    s, 3, epsilon=2.0, delta=1e-6, algorithm=a, seed=SEED,
                    insecure_noise_seed=SEED, **_account(work, f"{a}-{n}", n == "zarr"),
                ),
            )  # fmt: skip
    yield (
        "factorize non-private",
        lambda: pipeline.factorize(A, 3, private=False, seed=SEED),
    )


def _pcas(work: Path) -> Iterator[tuple[str, Callable[[], Any]]]:
    X = coherent_matrix(4096, 12, 2, support=4096, top=300, bottom=60, rng=3).A
    for method in ("power", "analyze-gauss"):
        yield (
            f"pca {method}",
            lambda m=method: pipeline.pca(
                X, 2, epsilon=2.0, delta=1e-6, method=m,
                iterations=(4 if m == "power" else None),
                clip_radius=(0.1 if m == "power" else None),
                insecure_noise_seed=SEED, dataset=f"digest-pca-{m}",
            ),
        )  # fmt: skip
    yield (
        "pca select",
        lambda: pipeline.pca(X, 2, epsilon=4.0, delta=1e-6, select=True,
                             insecure_noise_seed=SEED, dataset="digest-select"),
    )  # fmt: skip

    def centred() -> Any:
        est = pipeline.DPPCA(2, epsilon=2.0, delta=1e-6, centre=True,
                             random_state=SEED, insecure_noise=True,
                             dataset="digest-centred").fit(X + 3.0)  # fmt: skip
        return (est.components_, est.mean_, est.explained_variance_)

    yield "DPPCA centred", centred


def _stream(work: Path, mechanism: str) -> Any:
    state = work / f"s-{mechanism}.stream"
    stream_init(state, n_rows=30, n_cols=20, rank=2, horizon=2, epsilon=2.0,
                delta=1e-6, unit="row", ledger=work / f"s-{mechanism}.json",
                budget=BUDGET, seed=SEED, insecure_noise_seed=SEED,
                mechanism=mechanism)  # fmt: skip
    rng = np.random.default_rng(SEED)
    batch = {"entity": np.arange(30), "i": np.arange(30), "j": rng.integers(0, 20, 30),
             "s": rng.uniform(-1.0, 1.0, 30)}  # fmt: skip
    write_batch(work / f"b-{mechanism}.npz", batch)
    stream_ingest(state, work / f"b-{mechanism}.npz", epoch=1)
    release, _ = stream_release(state, epoch=1, out=work / f"e1-{mechanism}.zarr")
    return release


def _arrays(result: Any) -> tuple[Any, ...]:
    if isinstance(result, tuple):
        return result
    if hasattr(result, "U"):
        return (np.asarray(result.U), result.S, result.V)
    return (result.components, result.eigenvalues)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = [
            *_factorizations(work),
            *_pcas(work),
            # the tree's line is that of every stream before the mechanism choice
            ("stream epoch 1", lambda: _stream(work, "tree")),
            ("stream epoch 1 blt", lambda: _stream(work, "blt")),
        ]
        for name, run in runs:
            print(f"{name:32s} {digest(*_arrays(run()))}", flush=True)


if __name__ == "__main__":
    main()

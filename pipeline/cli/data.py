"""The ``dplr generate``, ``dplr convert`` and ``dplr demo`` commands (registered by :mod:`pipeline.cli.main`)."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
from typing import Any

from pipeline.cli.common import EXIT_OK, factorize_summary, pair
from pipeline.errors import InvalidParameterError


def add_parser(sub: Any) -> None:
    """Add ``generate``, ``convert`` and ``demo`` to ``sub``; they dispatch to
    :func:`run_generate`, :func:`run_convert` and :func:`run_demo`."""
    _add_generate_parser(sub)
    _add_convert_parser(sub)
    _add_demo_parser(sub)


def _add_coherent_options(pca: Any) -> None:
    """The options of ``dplr generate --kind pca-coherent``."""
    pca.add_argument(
        "--rank", type=int, help="target rank k, in [1, min(COLS, SUPPORT) - 1]"
    )
    pca.add_argument(
        "--support",
        type=int,
        help="rows carrying the top-k left singular vectors: a power of two "
        "<= ROWS (ROWS: perfectly incoherent; small: coherent)",
    )
    pca.add_argument(
        "--top", type=float, help="sigma_k^2, the k-th eigenvalue of A^T A"
    )
    pca.add_argument(
        "--bottom",
        type=float,
        help="sigma_{k+1}^2 = ... = sigma_d^2, in [0, TOP); eigengap TOP - BOTTOM",
    )
    pca.add_argument(
        "--head-ratio",
        type=float,
        help="sigma_1^2 = ... = sigma_{k-1}^2 = HEAD_RATIO * TOP (default 1.2)",
    )


def _add_generate_parser(sub: Any) -> None:
    """``dplr generate``: a synthetic Zarr matrix with a known spectrum."""
    g = sub.add_parser(
        "generate",
        help="write a synthetic Zarr matrix with a known spectrum",
        description=(
            "Write a synthetic matrix with a known SVD to a Zarr v3 array. "
            "--kind lowrank: A = c U diag(sigma) V^T with orthonormal U, V; max row "
            "norm = --max-row-norm. --kind pca-coherent: PCA test data whose top "
            "--rank left singular vectors live on --support rows (coherence "
            "1/sqrt(SUPPORT)), with sigma_k^2 = --top and sigma_{k+1}^2 = ... = "
            "--bottom; every row norm <= 1. Private power PCA beats Analyze Gauss "
            "on incoherent data (SUPPORT = ROWS) and loses on coherent data (small "
            "SUPPORT). The exact ground truth is stored in the array attributes."
        ),
    )
    g.add_argument(
        "out",
        metavar="OUT",
        help="path of the new Zarr array (stream-batch: a .parquet, .csv, .npz "
        "or .zarr batch file)",
    )
    g.add_argument("--rows", type=int, required=True)
    g.add_argument("--cols", type=int, required=True)
    g.add_argument(
        "--kind",
        choices=("lowrank", "pca-coherent", "stream-batch"),
        default="lowrank",
        help="lowrank (default): prescribed decay; pca-coherent: chosen "
        "coherence and eigengap, built in memory (ROWS * COLS <= 2^26); "
        "stream-batch: a batch of --updates random updates (entity, i, j, s) "
        "for `dplr stream ingest`, each entity a row (entity = i)",
    )
    g.add_argument(
        "--updates",
        type=int,
        default=10000,
        help="stream-batch: number of updates (default 10000)",
    )
    _add_coherent_options(g.add_argument_group("pca-coherent"))
    _add_lowrank_options(g.add_argument_group("lowrank"))
    g.add_argument(
        "--chunks",
        type=pair,
        default=(10000, -1),
        help="ROWS,COLS of a chunk; -1 = whole axis (default 10000,-1)",
    )
    g.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--overwrite", action="store_true")
    g.set_defaults(handler=run_generate)


def _add_lowrank_options(grp: Any) -> None:
    """The options of ``--kind lowrank``: its spectrum, its scale, its sparsity."""
    grp.add_argument(
        "--spectrum",
        choices=("geometric", "flat"),
        default="geometric",
        help="decaying (decay^j) or flat tail of ones after a head",
    )
    grp.add_argument(
        "--decay", type=float, default=0.9, help="geometric ratio (default 0.9)"
    )
    grp.add_argument(
        "--head",
        type=int,
        default=10,
        help="flat: number of large singular values (default 10)",
    )
    grp.add_argument(
        "--head-value",
        type=float,
        default=10.0,
        help="flat: their value relative to the tail (default 10)",
    )
    grp.add_argument(
        "--max-rank",
        type=int,
        default=1024,
        help="number of non-zero singular values, at most (default 1024)",
    )
    grp.add_argument(
        "--max-row-norm",
        type=float,
        default=1.0,
        help="largest row norm after scaling (default 1)",
    )
    grp.add_argument(
        "--sparse",
        type=float,
        default=None,
        metavar="DENSITY",
        help="lowrank: write a sparse matrix with about DENSITY * ROWS * COLS "
        "stored entries as a CSR group in AnnData's layout (docs/sparse.md): "
        "1/DENSITY dense diagonal blocks on random column sets, the spectrum "
        "dealt among them",
    )


def _add_convert_parser(sub: Any) -> None:
    """``dplr convert``: COO Parquet batches to a CSR store, out of core."""
    c = sub.add_parser(
        "convert",
        help="convert the COO Parquet files of a stream batch into a CSR store",
        description=(
            "Convert the triples (i, j, s) of one or more Parquet files (a stream "
            "batch's files; other columns such as entity are ignored) into a CSR "
            "matrix in AnnData's Zarr layout (docs/sparse.md), for a one-shot "
            "`dplr factorize` or `dplr pca`. Repeated cells are summed (as scipy "
            "converts COO). Out of core: two reads of the files and one spilled "
            "copy of the triples beside OUT; memory O(--band-entries + ROWS). A bad "
            "file is refused before anything is written."
        ),
    )
    c.add_argument("batches", nargs="+", metavar="BATCH", help="a .parquet file")
    c.add_argument("--rows", type=int, required=True, help="public number of rows")
    c.add_argument("--cols", type=int, required=True, help="public number of columns")
    c.add_argument("--out", required=True, help="path of the new CSR store (.zarr)")
    c.add_argument(
        "--band-entries",
        type=int,
        default=2**22,
        help="triples held in memory at once: per piece read and per row band "
        "written (default 4194304, about 100 MB)",
    )
    c.add_argument("--overwrite", action="store_true")
    c.set_defaults(handler=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """``dplr convert``: the store, then one line naming what was written."""
    from pipeline.jobs.data import coo_to_csr  # heavy: zarr

    m, n = coo_to_csr(
        args.batches,
        args.out,
        shape=(args.rows, args.cols),
        band_entries=args.band_entries,
        overwrite=args.overwrite,
    )
    count = len(args.batches)
    print(
        f"wrote {m} x {n} float64 CSR matrix to {args.out} from {count} COO batch "
        f"file{'s' if count > 1 else ''} (duplicates summed)"
    )
    return EXIT_OK


def _add_demo_parser(sub: Any) -> None:
    """``dplr demo``: generate a sample matrix and factorize it."""
    d = sub.add_parser(
        "demo",
        help="generate a sample matrix and factorize it on an embedded cluster",
        description="Generate a 20000 x 2000 sample matrix with entries of order 1 and a rank-2 signal, "
        "declare a lifetime budget, release a (2, 1e-6)-DP rank-2 factorization with "
        "entry-level privacy on an embedded LocalCluster, and print its summary "
        "(--json: the full report). The files go to a temporary directory that is "
        "removed at the end, or to --dir, which is kept.",
    )
    d.add_argument(
        "--dir",
        help="working directory, kept afterwards (default: a new temporary "
        "directory, removed at the end)",
    )
    d.add_argument(
        "--json",
        action="store_true",
        help="print the release's full privacy report (JSON) instead of its summary",
    )
    d.add_argument("--rows", type=int, default=20000)
    d.add_argument("--cols", type=int, default=2000)
    d.add_argument("--rank", type=int, default=2)
    d.add_argument("--epsilon", type=float, default=2.0)
    d.add_argument("--delta", type=float, default=1e-6)
    d.add_argument(
        "--scheduler", help="Dask scheduler address (default: an embedded LocalCluster)"
    )
    d.set_defaults(handler=run_demo)


def run_generate(args: argparse.Namespace) -> int:
    """``dplr generate``: a synthetic store with its ground truth in the attributes."""
    from pipeline.jobs.data import generate_store  # heavy: zarr

    def bar(done: int, total: int) -> None:
        sys.stderr.write(
            f"\r[{'#' * (40 * done // total):<40}] {100 * done // total:3d}% | writing row blocks"
        )
        if done == total:
            sys.stderr.write("\n")

    if args.sparse is not None and args.kind != "lowrank":
        raise InvalidParameterError(
            f"--sparse applies only to --kind lowrank, got --kind {args.kind}."
        )
    if args.kind == "pca-coherent":
        return _generate_pca(args, bar)
    if args.kind == "stream-batch":
        return _generate_batch(args)
    given = [
        f"--{name.replace('_', '-')}"
        for name in ("rank", "support", "top", "bottom", "head_ratio")
        if getattr(args, name) is not None
    ]
    if args.sparse is not None:
        return _generate_sparse(args, bar, given)
    if given:
        raise InvalidParameterError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only "
            "to --kind pca-coherent, got --kind lowrank."
        )
    meta = generate_store(
        args.out,
        args.rows,
        args.cols,
        spectrum=args.spectrum,
        decay=args.decay,
        head=args.head,
        head_value=args.head_value,
        max_rank=args.max_rank,
        max_row_norm=args.max_row_norm,
        **_store_options(args, bar),
    )
    return _wrote(
        args,
        f"spectrum {args.spectrum}, rank {meta['rank']}, max row norm {args.max_row_norm:g}",
    )


def _generate_sparse(args: argparse.Namespace, bar: Any, given: list[str]) -> int:
    """``dplr generate --sparse DENSITY``: a CSR group with a known spectrum."""
    from pipeline.jobs.data import generate_sparse_store  # heavy: zarr

    if given:
        raise InvalidParameterError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only "
            "to --kind pca-coherent, not to --sparse."
        )
    meta = generate_sparse_store(
        args.out, args.rows, args.cols, density=args.sparse, spectrum=args.spectrum,
        decay=args.decay, head=args.head, head_value=args.head_value,
        max_rank=args.max_rank, max_row_norm=args.max_row_norm,
        **_store_options(args, bar),
    )  # fmt: skip
    return _wrote(
        args,
        f"sparse CSR, density {args.sparse:g} in {meta['blocks']} blocks, "
        f"spectrum {args.spectrum}, rank {meta['rank']}, "
        f"max row norm {args.max_row_norm:g}",
    )


def _store_options(args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """The keyword arguments both generators take from ``dplr generate``."""
    return {
        "chunks": args.chunks, "dtype": args.dtype, "seed": args.seed,
        "overwrite": args.overwrite, "progress": bar,
    }  # fmt: skip


def _wrote(args: argparse.Namespace, detail: str) -> int:
    print(
        f"wrote {args.rows} x {args.cols} {args.dtype} matrix to {args.out} ({detail})"
    )
    return EXIT_OK


def _generate_batch(args: argparse.Namespace) -> int:
    """``--kind stream-batch``: uniform cells, standard normal values, entity = row."""
    from pipeline.jobs.data import generate_batch  # heavy: zarr

    if os.path.lexists(args.out) and not args.overwrite:
        raise InvalidParameterError(
            f"{args.out!r} exists; pass --overwrite to replace it."
        )
    generate_batch(
        args.out,
        (args.rows, args.cols),
        args.updates,
        seed=args.seed,
        overwrite=args.overwrite,
    )
    print(
        f"wrote a batch of {args.updates} updates (entity, i, j, s) of a "
        f"{args.rows} x {args.cols} stream to {args.out}"
    )
    return EXIT_OK


def _generate_pca(args: argparse.Namespace, bar: Any) -> int:
    from pipeline.jobs.data import generate_pca_store  # heavy: zarr

    missing = [
        f"--{name}"
        for name in ("rank", "support", "top", "bottom")
        if getattr(args, name) is None
    ]
    if missing:
        raise InvalidParameterError(
            "--kind pca-coherent requires --rank, --support, --top and --bottom, "
            f"got no {', '.join(missing)}."
        )
    meta = generate_pca_store(
        args.out,
        args.rows,
        args.cols,
        args.rank,
        support=args.support,
        top=args.top,
        bottom=args.bottom,
        head_ratio=1.2 if args.head_ratio is None else args.head_ratio,
        **_store_options(args, bar),
    )
    return _wrote(
        args,
        f"pca-coherent, rank {meta['rank']}, support {meta['support']}, "
        f"coherence {meta['coherence']:.4g}, gap_k {meta['gap_k']:g}, "
        f"kappa_k {meta['kappa_k']:.4g}, max row norm {meta['max_row_norm']:.4g}",
    )


def run_demo(args: argparse.Namespace) -> int:
    """``dplr demo``: generate a sample store, declare its budget, release, print
    the summary (``--json``: the report); a temporary directory is removed."""
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import make_params

    # the release's parameters are checked before anything is written
    params = make_params(
        args.rank, epsilon=args.epsilon, delta=args.delta, unit="entry"
    )
    if args.dir is not None:
        os.makedirs(args.dir, exist_ok=True)
        _demo(args, params, args.dir)
        _say(args, f"the demo's files are in {args.dir} (kept)")
        return EXIT_OK
    work = tempfile.mkdtemp(prefix="dplr-demo-")
    try:
        _demo(args, params, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(
        args,
        f"removed the demo's temporary directory {work} (--dir DIR keeps the files)",
    )
    return EXIT_OK


def _say(args: argparse.Namespace, line: str) -> None:
    """A line of the demo's story: stdout, or stderr when stdout is --json's."""
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _demo(args: argparse.Namespace, params: Any, work: str) -> None:
    # heavy: scipy, kept off the import path of `dplr --help`
    from pipeline.api import factorize
    from pipeline.jobs.data import generate_store  # heavy: zarr

    store = os.path.join(work, "sample.zarr")
    out = os.path.join(work, "release.zarr")
    _say(
        args,
        f"1/3 generating a {args.rows} x {args.cols} matrix with a rank-{args.rank} "
        f"signal, entries of order 1, at {store}",
    )
    # entry-level privacy: one individual owns one cell (|a_ij| <= C = 1 after clipping);
    # a released U is per-row output, so row-level privacy would drown it in noise
    meta = generate_store(
        store,
        args.rows,
        args.cols,
        spectrum="flat",
        head=args.rank,
        head_value=30.0,
        max_row_norm=0.8 * math.sqrt(args.cols),
        chunks=(2500, -1),
        overwrite=True,
        seed=0,
    )
    ledger = store + ".dplr-ledger.json"
    for stale in (ledger, ledger + ".lock"):
        if os.path.exists(stale):
            os.remove(stale)  # the demo's store is new, so is its budget
    _say(
        args, f"2/3 declaring a lifetime budget of (epsilon=10, delta=1e-5) in {ledger}"
    )
    _say(
        args,
        f"3/3 releasing a rank-{args.rank} ({args.epsilon:g}, {args.delta:g})-DP "
        f"factorization ({params.algorithm.value}, unit=entry, C=1)",
    )
    result = factorize(
        store,
        args.rank,
        epsilon=args.epsilon,
        delta=args.delta,
        unit="entry",
        clip_norm=1.0,
        out=out,
        overwrite=True,
        budget=(10.0, 1e-5),
        scheduler=args.scheduler,
        progress=sys.stderr,
    )
    if args.json:
        print(json.dumps(result.report, indent=2), flush=True)
        return
    print(factorize_summary(result.report, out))
    true = ", ".join(f"{x:.1f}" for x in meta["singular_values"][: args.rank + 1])
    print(
        f"  released S = [{', '.join(f'{x:.1f}' for x in result.S)}]; the synthetic matrix's true "
        f"singular values are [{true}] (known because the demo generated it)"
    )

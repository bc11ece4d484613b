"""The ``dplr stream`` command (registered by :mod:`pipeline.cli.main`).

Exit codes, as for every dplr command: 0 success, 2 bad input (nothing lost or
changed), 3 exhausted budget or horizon, 75 another run holds the stream's lock
(retry later), 1 any other failure.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from pipeline.cli.common import (
    add_params,
    budget_of,
    cluster_of,
    params_kwargs,
    signal_lines,
    unless_locked,
    warn_signal,
)
from pipeline.params import StreamParams


def add_parser(sub: Any) -> None:
    """Add ``stream`` (init, ingest, release, status) to ``sub``; it dispatches to
    :func:`run`."""
    s = sub.add_parser(
        "stream",
        help="turnstile update streams with continual (nightly) DP releases",
        description=(
            "A matrix that changes by batches of (entity, i, j, s) updates over epochs "
            "1..T, released after any epoch by a factorization mechanism for continual "
            "release (--mechanism: blt by default, sqrt-factorization, or the binary "
            "tree); the whole "
            "stream costs its (epsilon, delta) once, charged at init to the ledger of "
            "its population (--ledger), where it composes with the population's other "
            "streams and releases."
        ),
    )
    s.set_defaults(handler=run)
    ss = s.add_subparsers(dest="stream_command", required=True, metavar="ACTION")

    i = ss.add_parser("init", help="create a stream state and charge its budget once")
    i.add_argument("state", metavar="STATE", help="stream state directory to create")
    add_params(i, StreamParams, "stream")
    i.add_argument(
        "--ledger",
        metavar="PATH",
        help="the privacy ledger of the stream's population, charged once now and "
        "shared with its other streams and releases (required unless --non-private)",
    )
    i.add_argument(
        "--budget-epsilon",
        type=float,
        help="lifetime epsilon of the population, declared when --ledger does not exist yet",
    )
    i.add_argument(
        "--budget-delta",
        type=float,
        help="lifetime delta of the population, declared when --ledger does not exist yet",
    )
    i.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    i.add_argument("--insecure-noise-seed", type=int, help=argparse.SUPPRESS)

    g = ss.add_parser("ingest", help="apply a batch of updates to an epoch")
    g.add_argument("state", metavar="STATE")
    g.add_argument(
        "batch",
        metavar="BATCH",
        help=".parquet, .csv, .npz or .zarr with columns entity,i,j,s",
    )
    g.add_argument(
        "--epoch",
        type=int,
        required=True,
        help="epoch of the batch (after the last release)",
    )

    r = ss.add_parser("release", help="publish the factorization after an epoch")
    r.add_argument("state", metavar="STATE")
    r.add_argument("--epoch", type=int, required=True)
    r.add_argument("--out", "-o", required=True, help="Zarr group to publish")
    r.add_argument("--json", action="store_true", help="print the full report as JSON")
    c = r.add_mutually_exclusive_group()
    c.add_argument(
        "--scheduler",
        help="sketch the epochs being closed on this Dask scheduler "
        "(default: DASK_SCHEDULER_ADDRESS if set, else in this process)",
    )
    c.add_argument(
        "--cluster", metavar="FILE", help="cluster configuration (cluster/*.yaml)"
    )

    st = ss.add_parser("status", help="public summary of a stream")
    st.add_argument("state", metavar="STATE")


def run(args: argparse.Namespace) -> int:
    """Dispatch ``dplr stream ACTION``; errors propagate to main()."""
    action = {
        "init": _init,
        "ingest": _ingest,
        "release": _release,
        "status": _status,
    }[args.stream_command]
    return unless_locked(action, args)


def _init(a: argparse.Namespace) -> int:
    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.stream import stream_init

    kw = params_kwargs(StreamParams, a)
    if not kw["private"]:  # a non-private stream ignores a given budget
        kw["epsilon"] = kw["delta"] = None
    info = stream_init(
        a.state, **kw, ledger=a.ledger, budget=budget_of(a), seed=a.seed,
        insecure_noise_seed=a.insecure_noise_seed,
    )  # fmt: skip
    what = (
        f"(epsilon={info.epsilon:g}, delta={info.delta:g})-DP over all {info.horizon} epochs"
        if info.private
        else "NOT PRIVATE"
    )
    how = f"{info.mechanism} mechanism" + (
        f" ({info.levels} tree levels)" if info.mechanism == "tree" else ""
    )
    print(
        f"created stream {info.path}: {info.shape[0]} x {info.shape[1]}, rank {info.rank}, "
        f"{info.algorithm}, {how}, {what}"
    )
    if info.ledger is not None:
        # heavy: scipy, kept off the import path of `dplr --help`
        from pipeline.jobs.engine import Ledger

        book = Ledger.open(info.ledger)
        eps_used, _ = book.spent()
        print(
            f"charged to the ledger {info.ledger}: {len(book.releases)} release(s) compose to "
            f"epsilon={eps_used:.4g} at the budget's delta (lifetime budget epsilon="
            f"{book.budget[0]:g}, delta={book.budget[1]:g})"
        )
    return 0


def _ingest(a: argparse.Namespace) -> int:
    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.stream import stream_ingest

    out = stream_ingest(a.state, a.batch, epoch=a.epoch)
    # the batch's content fingerprint stays in the state: it is derived from private data
    print(f"applied {out['batch']} to epoch {out['epoch']} in {out['seconds']:.2f} s")
    return 0


def _release(a: argparse.Namespace) -> int:

    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.stream import stream_release

    if (
        a.scheduler is None
        and a.cluster is None
        and not os.environ.get("DASK_SCHEDULER_ADDRESS")
    ):
        f, new = stream_release(a.state, epoch=a.epoch, out=a.out)
    else:
        # heavy: zarr, kept off the import path of `dplr --help`
        from pipeline.jobs.clusters import cluster_client

        with cluster_client(a.scheduler, cluster_config=cluster_of(a)) as (client, _):
            f, new = stream_release(a.state, epoch=a.epoch, out=a.out, client=client)
    rep = f.report
    if a.json:
        print(json.dumps(rep, indent=2))
        return 0
    word = "released" if new else "already released"
    stds = ", ".join(f"{k}={v:.4g}" for k, v in rep["stream"]["noise_std"].items())
    priv = (
        f"(epsilon={rep['epsilon']:g}, delta={rep['delta']:g})-DP for the whole stream"
        if rep["epsilon"] is not None
        else "NOT PRIVATE"
    )
    if rep.get("note"):
        priv += f"; {rep['note']}"
    s = rep["stream"]
    # reports of streams before the mechanism choice name no mechanism: the tree
    how = f"{s.get('mechanism', 'tree')} mechanism" + (
        f", noise factor {s['noise_factor']:.4g}" if "noise_factor" in s else ""
    )
    print(
        f"epoch {a.epoch} {word} -> {a.out}: rank {rep['rank']}, {priv}; {how}; "
        f"noise std {stds}"
    )
    for line in signal_lines(rep):
        print(line.strip())
    warn_signal(rep)
    return 0


def _status(a: argparse.Namespace) -> int:
    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.stream import stream_status

    print(json.dumps(stream_status(a.state).to_dict(), indent=2))
    return 0

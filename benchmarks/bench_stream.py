"""Turnstile streams: ingest throughput, and continual release (noise per epoch, error, ledger).

Usage::

    python benchmarks/bench_stream.py                      # both parts
    python benchmarks/bench_stream.py --part throughput    # or continual
    python benchmarks/bench_stream.py --quick              # small sizes: a smoke run

Parts (results in benchmarks/results/stream[_quick].json|md):

* ``throughput`` a private 10^5 x 10^5 stream (rank 10, default DP sketch sizes t = 40,
  v = 160, unit ``row``, C = 1, epsilon = 1, delta = 1e-6, horizon 64). 10^6 updates of
  :func:`pipeline.linalg.stream_synthetic.turnstile_updates` (10 epochs of 10^5 updates,
  10 % withdrawals) are written to Parquet beforehand, as ONE file of 10^6 updates (the
  concatenation) and as 10 files of 10^5; all of them go into epoch 1 of a fresh state.
  ``stream_ingest`` (validate, clip per entity, record the clipped cells) always runs in
  this process; ``stream_release(epoch=1)`` closes the epoch, i.e. sketches all its cells
  once (:func:`pipeline.jobs.stream.epoch_sketch`), then adds the nodes' noise, factorizes and
  writes. Four configurations: {1 x 10^6, 10 x 10^5} x release {in-process, 2-worker
  LocalCluster (processes, 1 thread each) via ``client=``}. For each: ingest end to end,
  then the release end to end; and, on a second fresh state, the ingest through the
  public pieces timed one by one (read_batch + fingerprint, load of the entity table,
  clip_updates, the state commit), the epoch sketch through its pieces (epoch_cells,
  sort, partition_cells, sketch_partitions, sum_deltas; the state is not changed), then a
  profiled release. Ingest updates/s = 10^6 / the summed ingest time; ingest + release
  updates/s = 10^6 / (ingest + release time).
* ``continual`` T = 64 epochs of a 2000 x 500 stream (rank 5, 1000 updates per epoch, 10 %
  withdrawals, unit ``row``, C = 1, epsilon = 1, delta = 1e-6), run through the pieces of
  :mod:`pipeline.algorithms.continual` on in-memory arrays (clip_updates, sketch_cells,
  advance_tree, noisy_sketches, release_factorization) with several independent noise keys.
  Per epoch tau: popcount(tau), the predicted noise std sqrt(popcount) sigma (noise_std),
  the measured std of (noisy sketch - exact sum of the tree's levels), their ratio, and
  ||A(tau) - U S V^T||_2 against the spec 7.3 noise floor max_i sigma_i (sqrt m + sqrt n)
  times sqrt(popcount). Then a real 200 x 100 stream (stream_init, 64 x (stream_ingest,
  stream_release)) whose ledger must hold exactly one charge.

* ``costs`` what a stream costs by mechanism (blt, sqrt-factorization, tree): (1) the
  state's statistics (the bytes of its running sums, BLT buffers or tree p-sums) and
  its size on disk (the state directory, secrets included) of a 2000 x 200
  stream (rank 5, unit ``entry``; a batch of 500 cells at the first epoch of each tree
  node of the release epoch, so that every p-sum holds data) right after its release at
  epoch 2^floor(log2 T) - 1 (255 for T = 366, 4095 for T = 4096: the tree holds the
  most p-sums there), for T = 366 and T = 4096; (2) the wall time
  of ``dplr stream ingest`` as a subprocess (process start and imports included) of ONE
  Parquet file of 10^6 updates (``dplr generate --kind stream-batch``, each entity a row)
  into epoch 1 of a fresh private 10^5 x 10^5 stream (rank 10, unit ``row``, horizon 366),
  the default mechanism, once plain and once ``--exclusive`` (the one-entity-per-row check
  on); ``--repeat`` runs each, alternating, the children's CPU time (user + sys) beside
  the wall time. ``--sizes/--no-sizes``: the state sizes can be skipped to rerun the ingest.

Nothing here is an assertion. The machine is a shared 2-core VM: the load average is
recorded before and after every part.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import math
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

import _common as C
import numpy as np

PARTS = ("throughput", "continual", "costs")
EPS, DELTA = 1.0, 1e-6
T = time.perf_counter


def now() -> tuple[float, float]:
    """(wall clock, CPU time of this process): CPU time is less sensitive to other load."""
    return time.perf_counter(), time.process_time()


def lap(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return b[0] - a[0], b[1] - a[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=(*PARTS, "all"), default="all")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    p.add_argument("--repeat", type=int, default=2, help="throughput repetitions")
    p.add_argument(
        "--keys", type=int, default=4, help="continual: independent noise keys"
    )
    p.add_argument(
        "--no-cluster", action="store_true", help="throughput: in-process only"
    )
    p.add_argument(
        "--sizes", action=argparse.BooleanOptionalAction, default=True,
        help="costs: measure the state sizes (--no-sizes keeps the last run's)",
    )  # fmt: skip
    p.add_argument("--workdir", default=C.WORK)
    p.add_argument("--results", default=os.path.join(HERE, "results"))
    return p.parse_args(argv)


def load_info() -> dict[str, Any]:
    up = subprocess.run(
        ["uptime"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {"loadavg_1_5_15": [round(x, 2) for x in os.getloadavg()], "uptime": up}


def out_path(args: argparse.Namespace, ext: str) -> str:
    return os.path.join(args.results, f"stream{'_quick' if args.quick else ''}.{ext}")


def git_state() -> dict[str, Any]:
    """The commit, and the package files that differed from it, when the part starts."""

    def git(*a: str) -> str:
        r = subprocess.run(
            ["git", *a], capture_output=True, text=True, check=False, cwd=HERE
        )
        return r.stdout.strip()

    return {
        "head": git("rev-parse", "HEAD"),
        "pipeline_changes": git("status", "--short", "--", "../pipeline").splitlines(),
    }


def merge_results(
    args: argparse.Namespace, key: str, res: dict[str, Any]
) -> dict[str, Any]:
    """Keep the other part's results when one part is rerun."""
    import json

    path = out_path(args, "json")
    doc: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
    doc[key] = res
    doc["machine"] = C.machine()
    doc["versions"] = C.versions()
    C.dump_json(doc, path)
    return doc


# -- costs -------------------------------------------------------------------------------

COST_MECHANISMS = ("blt", "sqrt-factorization", "tree")


def _state_size(work: str, mech: str, horizon: int) -> dict[str, Any]:
    """Bytes of a 2000 x 200 stream's state after its release at epoch 2^L - 1."""
    from pipeline.io.batches import write_batch
    from pipeline.jobs.stream import (
        open_stream,
        stream_ingest,
        stream_init,
        stream_release,
    )

    m, n = 2000, 200
    state = os.path.join(work, f"{mech}-{horizon}.stream")
    stream_init(state, n_rows=m, n_cols=n, rank=5, horizon=horizon, epsilon=EPS,
                delta=DELTA, unit="entry", mechanism=mech,
                ledger=os.path.join(work, f"{mech}-{horizon}.json"), budget=(1e6, 0.5))  # fmt: skip
    tau = 2 ** int(math.log2(horizon)) - 1  # all bits set: the tree's most p-sums
    levels = int(math.log2(tau + 1))
    # one batch at the first epoch of each of tau's tree nodes, so that every p-sum
    # the tree holds at tau is one of data (an epoch without updates adds none)
    firsts = [tau + 1 - 2 ** (levels - j) + 1 for j in range(levels)]
    rng = np.random.default_rng(0)
    cells = rng.choice(m * n, 500 * levels, replace=False).reshape(levels, 500)
    for k, (epoch, c) in enumerate(zip(firsts, cells, strict=True)):
        batch = os.path.join(work, f"{mech}-{horizon}-{k}.npz")
        write_batch(batch, {"entity": c, "i": c // n, "j": c % n,
                            "s": rng.normal(size=c.size) * 0.1})  # fmt: skip
        stream_ingest(state, batch, epoch=epoch)
    t0 = time.perf_counter()
    stream_release(state, epoch=tau, out=state + ".zarr")
    secs = time.perf_counter() - t0
    st = open_stream(state)
    held = {p: sum(st.read(x).nbytes for x in st.names(p)) for p in ("running/", "blt/", "tree/")}
    # on disk the arrays are compressed: the statistics' own size is the comparison
    return {"epoch": tau, "bytes": dir_bytes(state), "statistics_bytes": sum(held.values()),
            "by_prefix": held, "close_and_release_s": secs}  # fmt: skip


def _cli_ingest(work: str, batch: str, exclusive: bool, tag: str) -> dict[str, float]:
    state = os.path.join(work, f"ingest-{tag}.stream")
    dplr = [sys.executable, "-m", "pipeline", "stream"]
    init = [*dplr, "init", state, "--rows", "100000", "--cols", "100000", "--rank", "10",
            "--horizon", "366", "--epsilon", "1", "--delta", "1e-6", "--unit", "row",
            "--ledger", state + ".json", "--budget-epsilon", "8", "--budget-delta", "1e-5"]  # fmt: skip
    subprocess.run([*init, *(["--exclusive"] if exclusive else [])], check=True,
                   capture_output=True)  # fmt: skip
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run([*dplr, "ingest", state, batch, "--epoch", "1"], check=True,
                   capture_output=True)  # fmt: skip
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    shutil.rmtree(state)
    return {"wall_s": wall, "cpu_s": cpu, "loadavg_1": os.getloadavg()[0]}


def part_costs(args: argparse.Namespace) -> dict[str, Any]:
    horizons = (366,) if args.quick else (366, 4096)
    updates = 10**5 if args.quick else 10**6
    out: dict[str, Any] = {"load_before": load_info(), "git": git_state(), "sizes": {}}
    if not args.sizes:  # keep the sizes of the last run
        import json

        with open(out_path(args, "json")) as f:
            out["sizes"] = json.load(f)["costs"]["sizes"]
    os.makedirs(args.workdir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as work:
        for mech in COST_MECHANISMS if args.sizes else ():
            for T_ in horizons:
                r = _state_size(work, mech, T_)
                out["sizes"][f"{mech} T={T_}"] = r
                print(f"  state {mech} T={T_}: {r['statistics_bytes'] / 2**20:.2f} MiB held, "
                      f"{r['bytes'] / 2**20:.2f} MiB on disk at epoch {r['epoch']}",
                      flush=True)  # fmt: skip
        batch = os.path.join(work, "batch.parquet")
        subprocess.run([sys.executable, "-m", "pipeline", "generate", batch, "--kind",
                        "stream-batch", "--rows", "100000", "--cols", "100000",
                        "--updates", str(updates), "--seed", "1"], check=True,
                       capture_output=True)  # fmt: skip
        out["updates"] = updates
        out["ingest"] = {"plain": [], "exclusive": []}
        for k in range(args.repeat):
            for tag in ("plain", "exclusive"):
                r = _cli_ingest(work, batch, tag == "exclusive", f"{tag}{k}")
                out["ingest"][tag].append(r)
                print(f"  dplr stream ingest ({tag}): {r['wall_s']:.2f} s wall, "
                      f"{r['cpu_s']:.2f} s CPU = {updates / r['wall_s']:.3g} updates/s "
                      f"(load {r['loadavg_1']:.1f})", flush=True)  # fmt: skip
    out["load_after"] = load_info()
    doc = merge_results(args, "costs", out)
    write_md(args, doc)
    return out


def md_costs(r: dict[str, Any]) -> str:
    lines = ["## Costs by mechanism\n",
             ("State on disk of a 2000 x 200 stream (rank 5, unit entry) after its "
              "release at epoch 2^floor(log2 T) - 1 (the tree's p-sums all held):\n"),
             "| mechanism | horizon | epoch | statistics held MiB | state on disk MiB |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for k, v in r["sizes"].items():
        mech, T_ = k.split(" T=")
        lines.append(f"| {mech} | {T_} | {v['epoch']} | {v['statistics_bytes'] / 2**20:.2f} "
                     f"| {v['bytes'] / 2**20:.2f} |")  # fmt: skip
    n = r["updates"]
    lines += ["", (f"`dplr stream ingest` of one Parquet file of {n:,} updates (subprocess, "
                   "process start included), median over runs:\n"),
              ("| stream | wall s (median / best) | CPU s | updates/s (median / best wall) "
               "| load avg |"), "|---|---:|---:|---:|---|"]  # fmt: skip
    for tag, runs in r["ingest"].items():
        walls = [x["wall_s"] for x in runs]
        w, b = _med(walls), min(walls)
        c = _med([x["cpu_s"] for x in runs])
        loads = [x["loadavg_1"] for x in runs]
        lines.append(f"| {tag} | {w:.2f} / {b:.2f} | {c:.2f} | {n / w:.3g} / {n / b:.3g} | "
                     f"{min(loads):.1f}-{max(loads):.1f} |")  # fmt: skip
    return "\n".join(lines) + "\n"


# -- throughput --------------------------------------------------------------------------


def write_batches(
    args: argparse.Namespace, m: int, n: int, total: int
) -> dict[str, Any]:
    """Parquet files: 10 batches of total/10 updates, and their concatenation as one file."""
    from pipeline.io.batches import write_batch
    from pipeline.linalg.stream_synthetic import turnstile_updates

    d = os.path.join(args.workdir, f"stream_{m}x{n}_u{total}")
    one = os.path.join(d, "all.parquet")
    ten = [os.path.join(d, f"part{k:02d}.parquet") for k in range(10)]
    if not all(os.path.exists(p) for p in [one, *ten]):
        os.makedirs(d, exist_ok=True)
        t0 = T()
        ups = turnstile_updates(
            m,
            n,
            rank=10,
            n_epochs=10,
            updates_per_epoch=total // 10,
            delete_fraction=0.1,
            seed=0,
        )
        for path, (e, i, j, s) in zip(ten, ups, strict=True):
            write_batch(path, {"entity": e, "i": i, "j": j, "s": s}, overwrite=True)
        cat = [np.concatenate([u[c] for u in ups]) for c in range(4)]
        write_batch(
            one, dict(zip(("entity", "i", "j", "s"), cat, strict=True)), overwrite=True
        )
        print(f"  wrote the batches in {T() - t0:.1f} s", flush=True)
    return {
        "dir": d,
        "one": [one],
        "ten": ten,
        "bytes_one": os.path.getsize(one),
        "bytes_ten": sum(os.path.getsize(p) for p in ten),
    }


def new_state(root: str, m: int, n: int, tag: str) -> tuple[str, str]:
    from pipeline.jobs.stream import stream_init

    state = os.path.join(root, f"state-{tag}")
    ledger = os.path.join(root, f"ledger-{tag}.json")
    stream_init(
        state,
        n_rows=m,
        n_cols=n,
        rank=10,
        horizon=64,
        epsilon=EPS,
        delta=DELTA,
        unit="row",
        clip_norm=1.0,
        ledger=ledger,
        budget=(EPS, DELTA),
    )
    return state, ledger


def dir_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(a, f)) for a, _, fs in os.walk(path) for f in fs
    )


def ingest_pieces(state: str, path: str, epoch: int) -> dict[str, float]:
    """One batch through the public pieces, each timed; the same commit as stream_ingest."""
    from pipeline.jobs.stream import (
        _entity_id_arrays,
        _load_entities,
        _read_stream_batch,
        open_stream,
        plan_of,
    )
    from pipeline.mechanisms.entities import clip_updates
    from pipeline.params import StreamUnit

    out: dict[str, float] = {}
    st = open_stream(state)
    with st.lock():
        m = st.manifest
        plan = plan_of(m)
        p = m["params"]
        t0 = now()
        plan.check_epoch(epoch)
        b, known = _read_stream_batch(st, m, path)
        fp = b.fingerprint()
        dup = any(rec["fingerprint"] == fp for rec in m["batches"]) if len(b) else False
        assert not dup
        t1 = now()
        table = _load_entities(st)
        t2 = now()
        c = clip_updates(
            b.entity,
            b.i,
            b.j,
            b.s,
            table=table,
            unit=StreamUnit(p["unit"]),
            clip_norm=p["clip_norm"],
            n_cols=p["n_cols"],
        )
        t3 = now()
        number = int(m["next_batch"])
        prefix = f"pending/{epoch}/{number:06d}/"
        arrays: dict[str, Any] = _entity_id_arrays(b, known) | {
            "entities/keys": c.table.keys,
            "entities/spent": c.table.spent,
            "entities/anchor": c.table.anchor,
            prefix + "rows": c.rows,
            prefix + "cols": c.cols,
            prefix + "vals": c.vals,
        }
        nbytes = sum(v.nbytes for v in arrays.values())
        pending = dict(m["pending"])
        pending[str(epoch)] = [*pending.get(str(epoch), []), number]
        record = {
            "fingerprint": fp,
            "epoch": epoch,
            "file": os.path.basename(path),
            "batch": number,
            "applied": "bench",
        }
        st.commit(
            arrays=arrays,
            changes={
                "pending": pending,
                "next_batch": number + 1,
                "batches": [*m["batches"], record],
                "entity_kind": m["entity_kind"] or b.entity_kind,
            },
        )
        t4 = now()
    out["read_validate"], out["read_validate_cpu"] = lap(t0, t1)
    out["entity_table_load"], out["entity_table_load_cpu"] = lap(t1, t2)
    out["clip"], out["clip_cpu"] = lap(t2, t3)
    out["state_write"], out["state_write_cpu"] = lap(t3, t4)
    out["state_write_MiB"] = nbytes / 2**20
    out["cells"] = int(c.rows.size)
    return out


def workers_cpu(client: Any) -> float:
    return sum(client.run(time.process_time).values()) if client is not None else 0.0


def epoch_sketch_pieces(state: str, epoch: int, client: Any) -> dict[str, Any]:
    """What epoch_sketch does, through the public pieces, each timed (the state is unchanged)."""
    from pipeline.algorithms.continual import partition_cells, sum_deltas
    from pipeline.execution.stream import sketch_partitions
    from pipeline.jobs.stream import epoch_cells, open_stream, plan_of

    st = open_stream(state)
    out: dict[str, Any] = {}
    with st.lock():
        plan = plan_of(st.manifest)
        t0 = now()
        rows, cols, vals = epoch_cells(st, epoch)
        t1 = now()
        if plan.lrf.transpose:
            rows, cols = cols, rows
        order = np.argsort(rows, kind="stable")
        rows, cols, vals = rows[order], cols[order], vals[order]
        t2 = now()
        n_parts = (
            1
            if client is None
            else 2 * max(1, len(client.scheduler_info().get("workers", {})))
        )
        parts = partition_cells(rows, cols, vals, n_parts, plan.lrf.params.tile_size)
        seed, _ = st.secrets()
        w0 = workers_cpu(client)
        t3 = now()
        deltas = sketch_partitions(plan, seed, parts, client)
        t4 = now()
        if client is not None:
            out["sketch_worker_cpu"] = workers_cpu(client) - w0
        sums = sum_deltas(plan, deltas)
        t5 = now()
        del sums, deltas
    out["read_cells"], out["read_cells_cpu"] = lap(t0, t1)
    out["sort"], out["sort_cpu"] = lap(t1, t2)
    out["partition"], out["partition_cpu"] = lap(t2, t3)
    out["sketch"], out["sketch_cpu"] = lap(t3, t4)
    out["sum_deltas"], out["sum_deltas_cpu"] = lap(t4, t5)
    out["cells"] = int(rows.size)
    out["n_parts"] = len(parts)
    return out


def sketch_detail(state: str, path: str) -> dict[str, float]:
    """The steps of sketch_cells on one whole batch, in this process, timed one by one."""
    import scipy.sparse as sp

    from pipeline.algorithms.continual import _compact, operators
    from pipeline.jobs.stream import _read_stream_batch, open_stream, plan_of
    from pipeline.mechanisms.entities import EntityTable, clip_updates
    from pipeline.params import StreamUnit

    st = open_stream(state)
    m = st.manifest
    plan = plan_of(m)
    p = m["params"]
    b, _ = _read_stream_batch(st, m, path)
    c = clip_updates(
        b.entity,
        b.i,
        b.j,
        b.s,
        table=EntityTable.empty(),
        unit=StreamUnit.ROW,
        clip_norm=1.0,
        n_cols=p["n_cols"],
    )
    ops = operators(plan, st.secrets()[0])
    out: dict[str, float] = {}
    t0 = now()
    M, N = plan.lrf.oriented_shape
    I, ii = _compact(c.rows, M)  # as sketch_cells does
    J, jj = _compact(c.cols, N)
    t1 = now()
    D = sp.csr_matrix((c.vals, (ii, jj)), shape=(I.size, J.size))
    Dt = D.T.tocsr()
    t2 = now()
    phi = ops["Phi"].rows(J)
    t3 = now()
    s_rows = ops["S"].rows(I)
    t4 = now()
    y = D @ phi
    t5 = now()
    z = Dt @ s_rows
    t6 = now()
    del y, z
    out["unique_I_J"], out["unique_I_J_cpu"] = lap(t0, t1)
    out["csr_build_and_transpose"], out["csr_build_and_transpose_cpu"] = lap(t1, t2)
    out["Phi_rows_J"], out["Phi_rows_J_cpu"] = lap(t2, t3)
    out["S_rows_I"], out["S_rows_I_cpu"] = lap(t3, t4)
    out["D_at_Phi"], out["D_at_Phi_cpu"] = lap(t4, t5)
    out["Dt_at_S"], out["Dt_at_S_cpu"] = lap(t5, t6)
    out["n_I"], out["n_J"], out["nnz"] = int(I.size), int(J.size), int(D.nnz)
    out["tile_size"] = plan.lrf.params.tile_size
    out["tiles_generated"] = int(
        np.unique(I // out["tile_size"]).size + np.unique(J // out["tile_size"]).size
    )
    out["normals_generated_M"] = (
        np.unique(J // plan.lrf.params.tile_size).size
        * plan.lrf.params.tile_size
        * plan.lrf.t
        + np.unique(I // plan.lrf.params.tile_size).size
        * plan.lrf.params.tile_size
        * plan.lrf.v
    ) / 1e6
    # the clipping step, profiled: which numpy calls
    prof = cProfile.Profile()
    prof.enable()
    clip_updates(
        b.entity,
        b.i,
        b.j,
        b.s,
        table=EntityTable.empty(),
        unit=StreamUnit.ROW,
        clip_norm=1.0,
        n_cols=p["n_cols"],
    )
    prof.disable()
    out["clip_profile"] = _top(prof, 8)  # type: ignore[assignment]
    return out


def _top(prof: cProfile.Profile, n: int) -> list[dict[str, Any]]:
    stats = pstats.Stats(prof)
    rows = []
    for (file, line, fn), (_, ncalls, tot, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append(
            {
                "function": f"{os.path.basename(file)}:{line}({fn})",
                "ncalls": ncalls,
                "tottime": round(tot, 4),
                "cumtime": round(cum, 4),
            }
        )
    return sorted(rows, key=lambda r: -r["tottime"])[:n]


RELEASE_STEPS = {
    "epoch_sketch": "epoch sketch (all cells, once)",
    "_close_epochs": "close epoch (sketch + fold into the tree + commit)",
    "noisy_sketches": "keyed node noise + sum",
    "release_factorization": "factorization of the noisy sketches",
    "write_release": "write the release group",
}


def profiled_release(state: str, out: str, client: Any) -> dict[str, float]:
    """stream_release under cProfile (this process only): cumulative seconds of its steps."""
    from pipeline.jobs.stream import stream_release

    prof = cProfile.Profile()
    t0 = T()
    prof.enable()
    stream_release(state, epoch=1, out=out, client=client)
    prof.disable()
    res = {"total": T() - t0}
    stats = pstats.Stats(prof)
    for (_, _, fn), (_, _, _, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        if fn in RELEASE_STEPS:
            res[fn] = res.get(fn, 0.0) + cum
    return res


def run_config(
    args: argparse.Namespace,
    root: str,
    files: list[str],
    m: int,
    n: int,
    client: Any,
    tag: str,
) -> dict[str, Any]:
    """Ingest (always in this process) then release epoch 1 (here or on ``client``)."""
    from pipeline.jobs.stream import stream_ingest, stream_release

    res: dict[str, Any] = {"load_before": load_info()}
    state, _ = new_state(root, m, n, tag + "-e2e")
    t0 = now()
    per = []
    for f in files:
        r = stream_ingest(state, f, epoch=1)
        per.append(r["seconds"])
    res["ingest_s"], res["ingest_cpu_s"] = lap(t0, now())
    res["ingest_reported_s"] = per
    res["state_MiB_after_ingest"] = dir_bytes(state) / 2**20
    w0 = workers_cpu(client)
    t0 = now()
    stream_release(
        state, epoch=1, out=os.path.join(root, f"rel-{tag}-e2e.zarr"), client=client
    )
    res["release_s"], res["release_cpu_s"] = lap(t0, now())
    res["release_worker_cpu_s"] = workers_cpu(client) - w0
    res["state_MiB_after_release"] = dir_bytes(state) / 2**20
    res["load_mid"] = load_info()
    shutil.rmtree(state)
    state, _ = new_state(root, m, n, tag + "-pieces")
    pieces = [ingest_pieces(state, f, 1) for f in files]
    res["pieces"] = {k: sum(p[k] for p in pieces) for k in pieces[0]}
    res["epoch_sketch_pieces"] = epoch_sketch_pieces(state, 1, client)
    res["release_profile"] = profiled_release(
        state, os.path.join(root, f"rel-{tag}-pieces.zarr"), client
    )
    shutil.rmtree(state)
    res["load_after"] = load_info()
    return res


def part_throughput(args: argparse.Namespace) -> dict[str, Any]:
    m = n = 10**4 if args.quick else 10**5
    total = 10**5 if args.quick else 10**6
    os.makedirs(args.workdir, exist_ok=True)
    files = write_batches(args, m, n, total)
    res: dict[str, Any] = {
        "shape": [m, n],
        "updates": total,
        "rank": 10,
        "t": 40,
        "v": 160,
        "unit": "row",
        "clip_norm": 1.0,
        "epsilon": EPS,
        "delta": DELTA,
        "horizon": 64,
        # paths relative to the repository: the results never name this machine's layout
        "files": {
            k: (
                [os.path.relpath(x, os.path.dirname(HERE)) for x in v]
                if isinstance(v, list)
                else os.path.relpath(v, os.path.dirname(HERE)) if k == "dir" else v
            )
            for k, v in files.items()
        },
        "git": git_state(),
        "command": " ".join(["python", "benchmarks/bench_stream.py", *sys.argv[1:]]),
        "load_start": load_info(),
        "runs": [],
    }
    cluster = client = None
    modes = ["in-process"] if args.no_cluster else ["in-process", "cluster"]
    try:
        if "cluster" in modes:
            cluster, client = C.start_cluster(2)
        root = tempfile.mkdtemp(prefix="bench-stream-", dir=args.workdir)
        # warm-up: imports and first-call costs in this process and on the workers
        from pipeline.jobs.stream import epoch_sketch, open_stream, stream_ingest

        st, _ = new_state(root, m, n, "warm")
        stream_ingest(st, files["ten"][0], epoch=1)
        from pipeline.jobs.stream import plan_of

        store = open_stream(st)
        for mode in modes:
            epoch_sketch(
                store,
                plan_of(store.manifest),
                1,
                client if mode == "cluster" else None,
            )
        shutil.rmtree(st)
        configs = [(mode, batching) for mode in modes for batching in ("1x", "10x")]
        for rep in range(args.repeat):
            order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
            for mode, batching in order:
                cl = client if mode == "cluster" else None
                fl = files["one"] if batching == "1x" else files["ten"]
                tag = f"{mode}-{batching}-r{rep}"
                print(f"  {tag} ({load_info()['uptime']})", flush=True)
                r = run_config(args, root, fl, m, n, cl, tag)
                r |= {"mode": mode, "batching": batching, "repetition": rep}
                r["updates_per_s"] = total / r["ingest_s"]
                r["end_to_end_updates_per_s"] = total / (r["ingest_s"] + r["release_s"])
                print(
                    f"    ingest {r['ingest_s']:.2f} s = {r['updates_per_s']:.3g} updates/s; "
                    f"release {r['release_s']:.2f} s; ingest + release "
                    f"{r['end_to_end_updates_per_s']:.3g} updates/s; ingest pieces "
                    + ", ".join(
                        f"{k} {v:.2f}"
                        for k, v in r["pieces"].items()
                        if isinstance(v, float) and not k.endswith("_cpu")
                    )
                    + "; epoch sketch pieces "
                    + ", ".join(
                        f"{k} {v:.2f}"
                        for k, v in r["epoch_sketch_pieces"].items()
                        if isinstance(v, float) and not k.endswith("_cpu")
                    )
                    + "; release profile "
                    + ", ".join(
                        f"{k} {v:.2f}" for k, v in r["release_profile"].items()
                    ),
                    flush=True,
                )
                res["runs"].append(r)
        print("  sketch_cells steps on the whole batch, in process", flush=True)
        st, _ = new_state(root, m, n, "detail")
        res["sketch_detail"] = sketch_detail(st, files["one"][0])
        shutil.rmtree(root, ignore_errors=True)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    res["load_end"] = load_info()
    doc = merge_results(args, "throughput", res)
    write_md(args, doc)
    return res


# -- continual ------------------------------------------------------------------------------


def part_continual(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.algorithms.continual import (
        advance_tree,
        noise_std,
        noisy_sketches,
        operators,
        plan_stream,
        release_factorization,
        sketch_cells,
        sum_deltas,
    )
    from pipeline.linalg.stream_synthetic import entity_budget_spent, turnstile_updates
    from pipeline.mechanisms.entities import EntityTable, clip_updates
    from pipeline.mechanisms.noise import NoiseKey
    from pipeline.params import Algorithm, ClipSpec, LrfParams, PrivacyUnit, StreamUnit

    m, n, k, horizon, upe = (
        (400, 100, 3, 16, 200) if args.quick else (2000, 500, 5, 64, 1000)
    )
    res: dict[str, Any] = {
        "shape": [m, n],
        "rank": k,
        "horizon": horizon,
        "updates_per_epoch": upe,
        "delete_fraction": 0.1,
        "epsilon": EPS,
        "delta": DELTA,
        "clip_norm": 1.0,
        "unit": "row",
        "noise_keys": args.keys,
        "load_before": load_info(),
        "git": git_state(),
    }
    t_start = T()
    params = LrfParams(
        algorithm=Algorithm.SPECTRAL,
        rank=k,
        epsilon=EPS,
        delta=DELTA,
        clip=ClipSpec(unit=PrivacyUnit.ROW, clip_norm=1.0),
    )
    plan = plan_stream(params, (m, n), horizon)
    res |= {
        "t": plan.lrf.t,
        "v": plan.lrf.v,
        "levels": plan.levels,
        "transposed": plan.lrf.transpose,
        "sigma": {s: plan.lrf.sigma(s) for s in plan.names},
    }
    seed = 12345
    ops = operators(plan, seed)
    ups = turnstile_updates(
        m,
        n,
        rank=k,
        n_epochs=horizon,
        updates_per_epoch=upe,
        delete_fraction=0.1,
        seed=7,
    )
    spent = entity_budget_spent(ups, m)
    res["entities_over_budget_unclipped"] = int((spent > 1.0).sum())
    res["max_budget_spent_unclipped"] = float(spent.max())
    keys = [NoiseKey.insecure_from_seed(1000 + r) for r in range(args.keys)]
    table = EntityTable.empty()
    levels: dict[int, dict[str, np.ndarray]] = {}
    A_raw = np.zeros((m, n))
    A_clip = np.zeros((m, n))
    floor_one = max(plan.lrf.sigma(s) for s in plan.names) * (
        math.sqrt(m) + math.sqrt(n)
    )
    res["noise_floor_one_node"] = floor_one
    rows = []
    all_cells: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for tau, (e, i, j, s) in enumerate(ups, start=1):
        np.add.at(A_raw, (i, j), s)
        c = clip_updates(
            e, i, j, s, table=table, unit=StreamUnit.ROW, clip_norm=1.0, n_cols=n
        )
        table = c.table
        np.add.at(A_clip, (c.rows, c.cols), c.vals)
        r_, c_, v_ = (
            (c.cols, c.rows, c.vals) if plan.lrf.transpose else (c.rows, c.cols, c.vals)
        )
        all_cells.append((r_, c_, v_))
        d = sum_deltas(plan, [sketch_cells(plan, ops, r_, c_, v_)])
        levels = advance_tree(levels, tau - 1, d)
        exact = {
            name: sum(part[name] for part in levels.values()) for name in plan.names
        }
        pred = noise_std(plan, tau)
        sq = dict.fromkeys(plan.names, 0.0)
        cnt = dict.fromkeys(plan.names, 0)
        errs = []
        for key in keys:
            noisy = noisy_sketches(plan, levels, tau, key)
            for name in plan.names:
                diff = noisy[name] - exact[name]
                sq[name] += float(np.sum(diff * diff))
                cnt[name] += diff.size
            f = release_factorization(plan, noisy, seed)
            errs.append(spectral_norm(A_clip - (f.U * f.S) @ f.V.T))
        sv = np.sqrt(np.maximum(np.linalg.eigvalsh(A_clip.T @ A_clip)[::-1], 0.0))
        pc = tau.bit_count()
        row = {"tau": tau, "popcount": pc}
        for name in plan.names:
            meas = math.sqrt(sq[name] / cnt[name])
            row[f"pred_{name}"] = pred[name]
            row[f"meas_{name}"] = meas
            row[f"ratio_{name}"] = meas / pred[name]
        row["err_median"] = statistics.median(errs)
        row["err_values"] = errs
        row["floor"] = floor_one * math.sqrt(pc)
        row["err_over_floor"] = row["err_median"] / row["floor"]
        row["A_norm2"] = float(sv[0])
        row["best_rank_k_err"] = float(sv[k]) if sv.size > k else 0.0
        row["clip_rel_change"] = float(
            np.linalg.norm(A_clip - A_raw) / max(np.linalg.norm(A_raw), 1e-300)
        )
        rows.append(row)
        if tau in (1, 2, 3, 4, 7, 8, 16, 31, 32, 63, 64):
            print(
                f"  tau {tau:2d} pc {pc}: Y {row['ratio_Y']:.3f} Z {row['ratio_Z']:.3f}; err "
                f"{row['err_median']:.1f} floor {row['floor']:.1f} ({row['err_over_floor']:.2f})",
                flush=True,
            )
    res["epochs"] = rows
    # linearity: the tree's levels sum to the sketch of all clipped cells at once
    cat = [np.concatenate([x[q] for x in all_cells]) for q in range(3)]
    once = sum_deltas(plan, [sketch_cells(plan, ops, *cat)])
    exact = {name: sum(part[name] for part in levels.values()) for name in plan.names}
    res["linearity_max_abs_diff"] = max(
        float(np.abs(once[nm] - exact[nm]).max()) for nm in plan.names
    )
    res["linearity_scale"] = max(float(np.abs(once[nm]).max()) for nm in plan.names)
    res["in_memory_wall_s"] = T() - t_start
    res["ledger"] = ledger_check(args)
    res["load_after"] = load_info()
    doc = merge_results(args, "continual", res)
    write_md(args, doc)
    return res


def spectral_norm(R: np.ndarray) -> float:
    """||R||_2 = sqrt(lambda_max(R^T R)) (R is tall: m >= n here)."""
    return float(np.sqrt(max(np.linalg.eigvalsh(R.T @ R)[-1], 0.0)))


def ledger_check(args: argparse.Namespace) -> dict[str, Any]:
    """A real stream: init, then ingest + release at every epoch; count the ledger's charges."""
    from pipeline.accounting.ledger import Ledger
    from pipeline.io.batches import write_batch
    from pipeline.jobs.stream import (
        stream_ingest,
        stream_init,
        stream_release,
        stream_status,
    )
    from pipeline.linalg.stream_synthetic import turnstile_updates

    horizon = 16 if args.quick else 64
    m, n = 200, 100
    root = tempfile.mkdtemp(prefix="bench-stream-ledger-", dir=args.workdir)
    t0 = T()
    try:
        state, ledger = os.path.join(root, "state"), os.path.join(root, "ledger.json")
        info = stream_init(
            state,
            n_rows=m,
            n_cols=n,
            rank=2,
            horizon=horizon,
            epsilon=EPS,
            delta=DELTA,
            unit="row",
            ledger=ledger,
            budget=(EPS, DELTA),
        )
        charges_after_init = len(Ledger.open(ledger).releases)
        ups = turnstile_updates(
            m,
            n,
            rank=2,
            n_epochs=horizon,
            updates_per_epoch=100,
            delete_fraction=0.1,
            seed=3,
        )
        published = 0
        reported = set()
        for tau, (e, i, j, s) in enumerate(ups, start=1):
            path = os.path.join(root, f"b{tau:02d}.parquet")
            write_batch(path, {"entity": e, "i": i, "j": j, "s": s})
            stream_ingest(state, path, epoch=tau)
            f, now = stream_release(
                state, epoch=tau, out=os.path.join(root, f"rel{tau:02d}.zarr")
            )
            published += int(now)
            reported.add(
                (
                    f.report["epsilon"],
                    f.report["delta"],
                    f.report["ledger"]["release_id"],
                )
            )
        # a rerun of the last release publishes nothing and charges nothing
        _, again = stream_release(
            state, epoch=horizon, out=os.path.join(root, f"rel{horizon:02d}.zarr")
        )
        book = Ledger.open(ledger)
        recs = book.releases
        return {
            "horizon": horizon,
            "shape": [m, n],
            "levels": info.levels,
            "releases_published": published,
            "rerun_published": bool(again),
            "charges_after_init": charges_after_init,
            "charges_after_all_releases": len(recs),
            "charge_release_ids": [r.get("release_id") for r in recs],
            "distinct_release_reports": [list(x) for x in reported],
            "spent": list(book.spent()),
            "budget": list(book.budget),
            "released_epochs": len(stream_status(state).released),
            "wall_s": T() - t0,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


# -- Markdown -------------------------------------------------------------------------------


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _b(b: str, total: int) -> str:
    return f"1 x {total:.0e}" if b == "1x" else f"10 x {total // 10:.0e}"


def md_throughput(r: dict[str, Any]) -> str:
    L = []
    m, n = r["shape"]
    L.append(
        f"## Ingest and release throughput: {m:,} x {n:,} private stream, {r['updates']:,} updates into epoch 1\n"
    )
    L.append(
        f"Command: `{r.get('command', 'python benchmarks/bench_stream.py --part throughput')}`, "
        f"{r['load_start']['uptime'].split()[0]}-{r['load_end']['uptime'].split()[0]} UTC on "
        f"{r['git']['head'][:7]}"
        + (
            f" (package changes: {r['git']['pipeline_changes']})"
            if r["git"]["pipeline_changes"]
            else ""
        )
        + ".\n"
    )
    L.append(
        f"Spectral, rank {r['rank']}, t = {r['t']}, v = {r['v']}, unit `row`, C = 1, epsilon = 1, delta = 1e-6, "
        f"horizon 64. Batches: Parquet ({r['files']['bytes_one'] / 2**20:.1f} MiB as one file, "
        f"{r['files']['bytes_ten'] / 2**20:.1f} MiB as 10 files), written beforehand. `stream_ingest` "
        "validates, clips and records the clipped cells, always in this process; `stream_release(epoch=1)` "
        "closes the epoch (sketches all its cells once) and publishes, in this process (`in-process`) or "
        "with `client=` a LocalCluster of 2 worker processes x 1 thread (`cluster`). Wall clock; medians "
        "(min-max) over the repetitions, one fresh state per run. Ingest + release updates/s = "
        f"{r['updates']:,} / (ingest s + release s). Target: >= 5e5 updates/s.\n"
    )
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in r["runs"]:
        groups.setdefault((run["mode"], run["batching"]), []).append(run)

    def mm(xs: list[float], fmt: str) -> str:
        return f"{_med(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

    L.append(
        "| release | batches | ingest s | ingest updates/s | ingest CPU s | release s | release CPU s "
        "(this process / workers) | ingest + release updates/s | state after ingest MiB | load avg (1 min) |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    for (mode, b), runs in groups.items():
        loads = [x["load_before"]["loadavg_1_5_15"][0] for x in runs] + [
            x["load_mid"]["loadavg_1_5_15"][0] for x in runs
        ]
        L.append(
            f"| {mode} | {_b(b, r['updates'])} | {mm([x['ingest_s'] for x in runs], '.2f')} "
            f"| {mm([x['updates_per_s'] for x in runs], '.3g')} "
            f"| {_med([x['ingest_cpu_s'] for x in runs]):.2f} "
            f"| {mm([x['release_s'] for x in runs], '.2f')} "
            f"| {_med([x['release_cpu_s'] for x in runs]):.2f} / {_med([x['release_worker_cpu_s'] for x in runs]):.2f} "
            f"| {mm([x['end_to_end_updates_per_s'] for x in runs], '.3g')} "
            f"| {_med([x['state_MiB_after_ingest'] for x in runs]):.0f} | {min(loads):.1f}-{max(loads):.1f} |"
        )
    L.append(
        "\nIngest breakdown (the same batches through the public pieces, on a second fresh state, in this "
        "process whatever the release mode; seconds summed over the batches, medians over the repetitions; "
        "wall (CPU of this process)):\n"
    )
    keys = ["read_validate", "entity_table_load", "clip", "state_write"]
    L.append(
        "| release | batches | "
        + " | ".join(keys)
        + " | sum | state written MiB | cells recorded |"
    )
    L.append("|---|---|" + "---|" * (len(keys) + 3))
    for (mode, b), runs in groups.items():
        vals = [_med([x["pieces"][k] for x in runs]) for k in keys]
        cpus = [_med([x["pieces"][k + "_cpu"] for x in runs]) for k in keys]
        L.append(
            f"| {mode} | {_b(b, r['updates'])} | "
            + " | ".join(f"{v:.2f} ({c:.2f})" for v, c in zip(vals, cpus, strict=True))
            + f" | {sum(vals):.2f} | {_med([x['pieces']['state_write_MiB'] for x in runs]):.0f} "
            f"| {runs[0]['pieces']['cells']:,} |"
        )
    L.append(
        "\nRelease of epoch 1 (stream_release under cProfile on the pieces' state, after the epoch sketch "
        "below; cumulative seconds of the steps in this process, medians; 'fold + commit' = close epoch - "
        "epoch sketch):\n"
    )
    L.append(
        "| release | batches | total | epoch sketch (all cells, once) | fold into the tree + commit "
        "| keyed node noise + sum | factorization | write the release group | other |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|")
    for (mode, b), runs in groups.items():
        pr = [x["release_profile"] for x in runs]

        def g(p: dict[str, float], k: str) -> float:
            return p.get(k, float("nan"))

        tot = _med([p["total"] for p in pr])
        sk = _med([g(p, "epoch_sketch") for p in pr])
        fold = _med([g(p, "_close_epochs") - g(p, "epoch_sketch") for p in pr])
        noise = _med([g(p, "noisy_sketches") for p in pr])
        fac = _med([g(p, "release_factorization") for p in pr])
        wr = _med([g(p, "write_release") for p in pr])
        other = _med(
            [
                p["total"]
                - g(p, "_close_epochs")
                - g(p, "noisy_sketches")
                - g(p, "release_factorization")
                - g(p, "write_release")
                for p in pr
            ]
        )
        L.append(
            f"| {mode} | {_b(b, r['updates'])} | {tot:.2f} | {sk:.2f} | {fold:.2f} | {noise:.2f} | {fac:.2f} | {wr:.2f} | {other:.2f} |"
        )
    L.append(
        "\nEpoch sketch through its public pieces (`epoch_cells`, stable argsort by row, `partition_cells`, "
        "`sketch_partitions`, `sum_deltas`) on the pieces' state before its release; wall (CPU of this "
        "process), medians:\n"
    )
    ek = ["read_cells", "sort", "partition", "sketch", "sum_deltas"]
    L.append(
        "| release | batches | "
        + " | ".join(ek)
        + " | sum | worker CPU s (sketch) | parts |"
    )
    L.append("|---|---|" + "---|" * (len(ek) + 3))
    for (mode, b), runs in groups.items():
        es = [x["epoch_sketch_pieces"] for x in runs]
        vals = [_med([e[k] for e in es]) for k in ek]
        cpus = [_med([e[k + "_cpu"] for e in es]) for k in ek]
        L.append(
            f"| {mode} | {_b(b, r['updates'])} | "
            + " | ".join(f"{v:.2f} ({c:.2f})" for v, c in zip(vals, cpus, strict=True))
            + f" | {sum(vals):.2f} | {_med([e.get('sketch_worker_cpu', 0.0) for e in es]):.2f} | {es[0]['n_parts']} |"
        )
    d = r.get("sketch_detail")
    if d:
        L.append(
            f"\n`sketch_cells` on the one-file batch (all updates) in one process, step by step (|I| = {d['n_I']:,}, "
            f"|J| = {d['n_J']:,}, nnz = {d['nnz']:,}; {d['normals_generated_M']:.1f} M Gaussians regenerated in tiles "
            f"of {d['tile_size']} rows):\n"
        )
        ks = [
            "unique_I_J",
            "csr_build_and_transpose",
            "Phi_rows_J",
            "S_rows_I",
            "D_at_Phi",
            "Dt_at_S",
        ]
        L.append("| " + " | ".join(ks) + " |")
        L.append("|" + "---|" * len(ks))
        L.append("| " + " | ".join(f"{d[k]:.3f}" for k in ks) + " |")
        L.append(
            "\n`clip_updates` on the same batch, top functions by own time (cProfile):\n"
        )
        L.append("| function | calls | own s | cumulative s |")
        L.append("|---|---|---|---|")
        for x in d["clip_profile"]:
            L.append(
                f"| `{x['function']}` | {x['ncalls']} | {x['tottime']:.3f} | {x['cumtime']:.3f} |"
            )
    L.append(
        f"\nLoad: start `{r['load_start']['uptime']}`; end `{r['load_end']['uptime']}`.\n"
    )
    return "\n".join(L)


def md_continual(r: dict[str, Any]) -> str:
    L = []
    m, n = r["shape"]
    L.append(
        f"## Continual release: {m} x {n}, rank {r['rank']}, T = {r['horizon']} epochs\n"
    )
    L.append(
        f"Spectral, t = {r['t']}, v = {r['v']}, L = {r['levels']} levels, epsilon = 1, delta = 1e-6, unit `row`, "
        f"C = 1; {r['updates_per_epoch']} updates per epoch (10 % withdrawals). sigma_Y = {r['sigma']['Y']:.4g}, "
        f"sigma_Z = {r['sigma']['Z']:.4g} per entry and node. {r['noise_keys']} independent noise keys per epoch. "
        f"Clipping: {r['entities_over_budget_unclipped']} of {m} entities would exceed C without it "
        f"(largest stream budget {r['max_budget_spent_unclipped']:.3f}). Noise floor (spec 7.3) for one node: "
        f"max_i sigma_i (sqrt m + sqrt n) = {r['noise_floor_one_node']:.1f}; per epoch it is scaled by "
        "sqrt(popcount). Error: ||A(tau) - U S V^T||_2 against the clipped A(tau), median over the keys.\n"
    )
    L.append(
        "| tau | popcount | pred std Y | meas std Y | ratio Y | pred std Z | meas std Z | ratio Z | error | floor x sqrt(pc) | error/floor | ||A(tau)||_2 | sigma_{k+1}(A(tau)) |"
    )
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for x in r["epochs"]:
        L.append(
            f"| {x['tau']} | {x['popcount']} | {x['pred_Y']:.4g} | {x['meas_Y']:.4g} | {x['ratio_Y']:.4f} | "
            f"{x['pred_Z']:.4g} | {x['meas_Z']:.4g} | {x['ratio_Z']:.4f} | {x['err_median']:.1f} | {x['floor']:.1f} | "
            f"{x['err_over_floor']:.3f} | {x['A_norm2']:.2f} | {x['best_rank_k_err']:.2f} |"
        )
    ry = [x["ratio_Y"] for x in r["epochs"]]
    rz = [x["ratio_Z"] for x in r["epochs"]]
    ef = [x["err_over_floor"] for x in r["epochs"]]
    L.append(
        f"\nMeasured/predicted std: Y {min(ry):.4f}-{max(ry):.4f}, Z {min(rz):.4f}-{max(rz):.4f} over the "
        f"{len(ry)} epochs. Error / (floor x sqrt(popcount)): median {_med(ef):.3f}, range {min(ef):.3f}-{max(ef):.3f}. "
        f"Linearity: the tree's levels at tau = T differ from one sketch of all clipped cells by at most "
        f"{r['linearity_max_abs_diff']:.2e} (entries up to {r['linearity_scale']:.2e}).\n"
    )
    lg = r["ledger"]
    L.append(
        f"Ledger (a real {lg['shape'][0]} x {lg['shape'][1]} stream through stream_init, then {lg['horizon']} x "
        f"(stream_ingest, stream_release)): {lg['releases_published']} releases published, charges in the ledger "
        f"after init {lg['charges_after_init']}, after all releases **{lg['charges_after_all_releases']}** "
        f"(release id {lg['charge_release_ids']}); spent (epsilon, delta) = {lg['spent']} of budget {lg['budget']}; "
        f"a rerun of the last release published again: {lg['rerun_published']}. Distinct (epsilon, delta, ledger id) "
        f"in the {lg['horizon']} release reports: {len(lg['distinct_release_reports'])}.\n"
    )
    L.append(
        f"Load: before `{r['load_before']['uptime']}`; after `{r['load_after']['uptime']}`.\n"
    )
    return "\n".join(L)


def write_md(args: argparse.Namespace, doc: dict[str, Any]) -> None:
    parts = [
        "# Turnstile streams (`benchmarks/bench_stream.py`)\n",
        f"Machine: {doc['machine']}.\n",
    ]
    if "throughput" in doc:
        parts.append(md_throughput(doc["throughput"]))
    if "continual" in doc:
        parts.append(md_continual(doc["continual"]))
    if "costs" in doc:
        parts.append(md_costs(doc["costs"]))
    with open(out_path(args, "md"), "w") as f:
        f.write("\n".join(parts))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parts = PARTS if args.part == "all" else (args.part,)
    with contextlib.suppress(AttributeError):
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    for part in parts:
        print(f"== part {part} == ({load_info()['uptime']})", flush=True)
        from threadpoolctl import threadpool_limits

        # one BLAS thread: threaded BLAS thrashes on a shared 2-core machine; the
        # cluster's workers have one thread each anyway
        with threadpool_limits(1 if part == "continual" else None):
            {"throughput": part_throughput, "continual": part_continual,
             "costs": part_costs}[part](args)  # fmt: skip
    print(f"results: {out_path(args, 'json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

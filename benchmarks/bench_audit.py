"""Empirical privacy audit, long run: the audits of tests/audit with more samples.

Runs every case of ``tests/audit/audit_cases.py`` -- the correct mechanisms,
the broken variants (negative controls) and the informational cases the tests
do not assert -- at the test suite's sample sizes times each of ``--scales``,
plus the end-to-end audits through ``run_lrf`` / ``run_pca``, and writes

* ``results/audit.json``: every row with the audit details (threshold, rates,
  Clopper-Pearson bounds), the settings and the machine;
* ``results/audit.md``: the tables (mechanism, declared eps, eps_lb, samples).

Usage::

    python benchmarks/bench_audit.py                 # scales 1 and 10, ~10 min
    python benchmarks/bench_audit.py --scales 1 --no-e2e --spread-seeds 0

Not part of CI; the same audits run in CI via ``pytest -m audit``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "audit"))
sys.path.insert(0, HERE)

import audit_cases as ac
from _common import dump_json, machine, versions

from pipeline.testing.audit import markdown_table

READING = """## Reading the tables

* The audits of Analyze Gauss and of the power method's releases are sharp: their
  worst-case pairs reach the declared epsilon exactly (`exact eps of the pair` = 1.000
  and 2.000, or 0.98 where 2% of the budget goes to the other releases), and with 10x
  the samples eps_lb comes within about 0.1 of it. They use `sensitivity='tight'`; the
  default `'paper'` over-noises `M` and `H` by sqrt 2 (row `[sensitivity=paper]`).
* The sketch-based LRF audits reach only ~0.6 of epsilon even with unlimited samples:
  the calibration charges the JL tail bound `Delta_JL(d, beta)` (spec sketch-lrf 4.2)
  for every pair, while a pair fixed independently of the sketch sees
  `||E Phi||_F ~ ||E||_F`. That slack is the price of a per-pair bound, not an error.
* The controls' `exact eps of the pair` is the epsilon they actually provide on the
  pair: noise per chunk (16 bands), the paper's noise constant, the symmetric-noise
  pitfall and clipping after the sum all exceed the declared epsilon, by factors of
  1.4 to 115.
* Informational rows: the paper's noise at epsilon = 1 is too small as well (exact
  1.25) but only narrowly detectable; at delta = 1e-6 the audit cannot resolve a noise
  level sqrt 2 too small with 1e6 samples per neighbour, which is why the tests
  declare delta = 1e-3."""


def run_cases(
    cases: dict[str, Any], n: int, seed: int, confidence: float, log: Any
) -> list[dict[str, Any]]:
    rows = []
    for key, build in cases.items():
        t0 = time.perf_counter()
        row = ac.run_case(build(), n, seed, confidence)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        log(
            f"  {key}: eps={row['epsilon']:g} eps_lb={row['epsilon_lb']:.3f} ({row['seconds']:.1f} s)"
        )
    return rows


def run_e2e(n: int, seed: int, confidence: float, log: Any) -> list[dict[str, Any]]:
    rows = []
    for key, make in ac.E2E.items():
        t0 = time.perf_counter()
        row = ac.e2e_row(make(n, seed), confidence)
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        log(
            f"  {key}: eps={row['epsilon']:g} eps_lb={row['epsilon_lb']:.3f} ({row['seconds']:.1f} s)"
        )
    return rows


def spread(seeds: int, confidence: float, log: Any) -> list[dict[str, Any]]:
    """eps_lb over seeds 0..seeds-1 at the test suite's sample size."""
    out = []
    for key, build in ac.CASES.items():
        case = build()
        lbs = [
            ac.run_case(case, ac.N_SAMPLES, s, confidence)["epsilon_lb"]
            for s in range(seeds)
        ]
        sd = float(np.std(lbs))
        # a bound limited by the sample size alone (all samples separated) does
        # not vary: no margin in standard deviations to report
        margin: Any = (np.mean(lbs) - case.epsilon) / sd if sd > 1e-3 else "saturated"
        out.append(
            {
                "mechanism": case.mechanism,
                "releases": case.releases,
                "variant": case.variant,
                "declared eps": case.epsilon,
                "eps_lb mean": float(np.mean(lbs)),
                "eps_lb sd": sd,
                "eps_lb min": float(np.min(lbs)),
                "eps_lb max": float(np.max(lbs)),
                "(mean - eps) / sd": margin,
            }
        )
        log(f"  {key}: {np.mean(lbs):.3f} +- {np.std(lbs):.3f}")
    return out


def markdown(result: dict[str, Any]) -> str:
    s = result["settings"]
    lines = [
        "# Empirical privacy audit",
        "",
        (
            f"{result['machine']['date']}; seed {s['seed']}; confidence {s['confidence']} "
            "per audit (union of four one-sided Clopper-Pearson bounds); delta "
            f"{s['delta']:g} unless stated."
        ),
        "",
        (
            "Each row: worst-case neighbours under the mechanism's adjacency (one row "
            "replaced, at 10x the clip norm, aligned to maximise the change of the released "
            "statistic), the exact statistics from the project's kernels, the noise from its "
            "calibration; the release is reduced to its likelihood-ratio projections (one "
            "per released block, combined with weights fitted on the selection half), the "
            "threshold is chosen on the selection half and the bound `eps_lb = "
            "max(log((1 - delta - FNR_hi) / FPR_hi), log((1 - delta - FPR_hi) / FNR_hi))` is "
            "evaluated on the other half. `exact eps of the pair` is the epsilon of the pair "
            "under the noise actually added (no sampling): an audit with unlimited samples "
            "converges to it. `caught` = eps_lb > declared eps. Rows marked (run_lrf) / "
            "(run_pca) run the mechanism itself once per sample with its own noise "
            "generator; the others draw the projections of the Gaussian noise directly."
        ),
        "",
    ]
    for run in result["runs"]:
        lines += [
            f"## Asserted audits, {run['label']} ({run['seconds']:.0f} s)",
            "",
            markdown_table(ac.table_rows(run["rows"])),
            "",
        ]
        if run["info_rows"]:
            lines += [
                f"Informational (not asserted in the tests), {run['label']}:",
                "",
                markdown_table(ac.table_rows(run["info_rows"])),
                "",
            ]
    lines += [READING, ""]
    if result["spread"]:
        lines += [
            f"## Spread of eps_lb over seeds 0-{s['spread_seeds'] - 1} at the test sample size",
            "",
            (
                "For a correct mechanism `(mean - eps) / sd` is how far below epsilon its "
                "bound sits; for a control, how far above."
            ),
            "",
            markdown_table(result["spread"]),
            "",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", type=int, nargs="+", default=[1, 10])
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--confidence", type=float, default=ac.CONFIDENCE)
    p.add_argument("--no-e2e", action="store_true", help="skip the end-to-end audits")
    p.add_argument("--spread-seeds", type=int, default=10)
    p.add_argument("--out", default=os.path.join(HERE, "results", "audit.json"))
    p.add_argument("--md", default=os.path.join(HERE, "results", "audit.md"))
    args = p.parse_args(argv)

    def log(msg: str) -> None:
        print(msg, flush=True)

    runs = []
    for scale in args.scales:
        n, n_e2e = scale * ac.N_SAMPLES, scale * ac.N_END_TO_END
        label = "test sample sizes" if scale == 1 else f"{scale}x the test sample sizes"
        log(f"scale {scale}: {n} samples per neighbour, {n_e2e} end-to-end runs")
        t0 = time.perf_counter()
        rows = [] if args.no_e2e else run_e2e(n_e2e, args.seed, args.confidence, log)
        rows += run_cases(ac.CASES, n, args.seed, args.confidence, log)
        info = run_cases(ac.INFO_CASES, n, args.seed, args.confidence, log)
        runs.append(
            {
                "scale": scale,
                "label": label,
                "n_per_neighbour": n,
                "n_end_to_end": 0 if args.no_e2e else n_e2e,
                "seconds": time.perf_counter() - t0,
                "rows": rows,
                "info_rows": info,
            }
        )
    log("spread over seeds")
    sp = (
        spread(args.spread_seeds, args.confidence, log) if args.spread_seeds > 1 else []
    )
    result = {
        "settings": {
            "seed": args.seed,
            "confidence": args.confidence,
            "delta": ac.DELTA,
            "scales": args.scales,
            "spread_seeds": args.spread_seeds,
            "n_chunks": ac.N_CHUNKS,
            "lrf_shape": ac.LRF_SHAPE,
            "lrf_sizes": ac.LRF_SIZES,
            "pca_d_k": [ac.PCA_D, ac.PCA_K],
        },
        "machine": machine(),
        "versions": versions(),
        "runs": runs,
        "spread": sp,
    }
    bad = [
        r["key"]
        for run in runs
        for r in run["rows"]
        if r["caught"] != (r["variant"] != "correct")
    ]
    result["unexpected"] = bad
    dump_json(result, args.out)
    with open(args.md, "w") as fh:
        fh.write(markdown(result))
    log(f"wrote {args.out} and {args.md}; unexpected outcomes: {bad or 'none'}")


if __name__ == "__main__":
    main()

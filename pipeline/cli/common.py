"""What the ``dplr`` subcommands share: exit codes, option groups, argument types,
the release options and runtime built from parsed arguments, and report lines.

Used by :mod:`pipeline.cli.main` (the parser and ``main``) and by the verbs'
modules (:mod:`pipeline.cli.factorize`, :mod:`pipeline.cli.budget`,
:mod:`pipeline.cli.pca`, :mod:`pipeline.cli.data`, :mod:`pipeline.cli.stream`,
:mod:`pipeline.cli.nightly`, :mod:`pipeline.cli.cluster`);
nothing here imports another module of :mod:`pipeline.cli`.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pipeline.errors import InvalidParameterError
from pipeline.jobs.locations import redact
from pipeline.params import ReleaseOptions, Runtime, assemble, flag_fields

EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_BUDGET = 0, 1, 2, 3
EXIT_LOCKED = 75  # EX_TEMPFAIL: a concurrent run holds the lock; try again later


#: Python advice with no flag of the same name: its words on the command line.
_CLI_PHRASES = (
    ("with private=True", "without --non-private"),
    ("private=True", "no --non-private"),
    ("private=False", "--non-private"),
)
_ASSIGNMENT = re.compile(r"(?<![\w/.-])([a-z][a-z0-9_]*)=(True|False|None|'[^']*')")
# not inside a path or a file name (a/b_c/d, b_c.zarr)
_SNAKE = re.compile(r"(?<![\w/.-])[a-z][a-z0-9]*(?:_[a-z0-9]+)+(?![\w/=-]|\.\w)")


def cli_words(message: str, flags: Iterable[str]) -> str:
    """An error of the Python layers in the words of the command line.

    The layers below the CLI speak Python (``pass private=False``,
    ``radius_grid ... apply to select=True only``), which is right for a caller
    of the Python API. On the command line each parameter that is one of
    ``flags`` becomes its flag: ``name=True`` -> ``--name``, ``name=None`` (or
    False) -> ``no --name``, ``name='v'`` -> ``--name v``, a bare ``snake_name``
    -> ``--snake-name``; ``private=False`` becomes ``--non-private``; ``--x
    (--x)`` collapses to ``--x``. A reported value (``got rank=600``), a file's
    key and a name that is no flag of this command are left as they are.
    """
    known = set(flags)
    for python, cli in _CLI_PHRASES:
        message = message.replace(python, cli)

    def assignment(m: re.Match[str]) -> str:
        flag = "--" + m[1].replace("_", "-")
        if flag not in known:
            return m[0]
        if m[2] in ("True", "False", "None"):
            return flag if m[2] == "True" else f"no {flag}"
        return f"{flag} {m[2].strip(chr(39))}"

    def snake(m: re.Match[str]) -> str:
        flag = "--" + m[0].replace("_", "-")
        return flag if flag in known else m[0]

    message = _SNAKE.sub(snake, _ASSIGNMENT.sub(assignment, message))
    return re.sub(r"(--[a-z][a-z0-9-]*) \(\1\)", r"\1", message)


def option_strings(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The ``--flags`` of the command ``argv`` invoked: of ``parser`` and of each
    subcommand on the way (``dplr stream init``: dplr's, stream's and init's)."""
    found: set[str] = set()
    while True:
        found.update(
            s for a in parser._actions for s in a.option_strings if s.startswith("--")
        )
        # argparse keeps no public list of a parser's actions or subcommands
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = next(
            (s.choices[w] for s in subs for w in argv if w in s.choices), None
        )
        if chosen is None:
            return found
        parser = chosen


def pair(text: str) -> tuple[int, int]:
    """``ROWS,COLS`` (argument type of ``--chunks``)."""
    try:
        a, b = (int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected ROWS,COLS (e.g. 10000,-1), got {text!r}"
        ) from None
    return a, b


def floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers (argument type)."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None


def ints(text: str) -> tuple[int, ...]:
    """Comma-separated integers (argument type)."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def add_params(p: Any, cls: type, section: str) -> None:
    """Add the flags of the fields of the parameter set ``cls`` listed in ``section``
    to the parser or group ``p``, in the order of the fields.

    The flags come from the fields' metadata (:class:`pipeline.params.Flag`): a new
    field with a flag in an existing section needs no edit here or in a verb.
    """
    for _, flag, _path in flag_fields(cls):
        if flag.section != section:
            continue
        if flag.switch or flag.negate:
            p.add_argument(*flag.names, action="store_true", help=flag.help)
            continue
        p.add_argument(
            *flag.names, type=flag.parse, choices=flag.choices, default=flag.default,
            required=flag.required, metavar=flag.metavar, help=flag.help,
        )  # fmt: skip


def params_kwargs(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``cls`` read from the parsed flags of its fields
    (nested parameter sets built from theirs); fields without a flag are left out."""
    values = {}
    for _, flag, path in flag_fields(cls):
        value = getattr(args, flag.dest)
        values[path] = (not value) if flag.negate else value
    return assemble(cls, values)


def params_of(cls: type, args: argparse.Namespace, **overrides: Any) -> Any:
    """The parameter set ``cls`` built (and so validated) from the parsed flags."""
    return cls(**{**params_kwargs(cls, args), **overrides})


def add_privacy(p: argparse.ArgumentParser, cls: type) -> None:
    """The ``privacy`` option group: the ``privacy`` section of ``cls`` (epsilon,
    delta, --non-private, ...), then the ledger's options."""
    g = p.add_argument_group("privacy")
    add_params(g, cls, "privacy")
    add_ledger(g)


def add_ledger(g: Any) -> None:
    """The ledger's options: its path, the lifetime budget it is created with, test-only noise."""
    g.add_argument(
        "--ledger",
        help="the dataset's privacy ledger (default: <INPUT>.dplr-ledger.json beside the store)",
    )
    g.add_argument(
        "--budget-epsilon",
        type=float,
        help="lifetime epsilon declared when the ledger is created",
    )
    g.add_argument(
        "--budget-delta",
        type=float,
        help="lifetime delta declared when the ledger is created",
    )
    g.add_argument(
        "--insecure-noise-seed",
        type=int,
        help="TESTS ONLY: reproducible noise; the report says private: false",
    )


def add_cluster(p: argparse.ArgumentParser) -> None:
    """``--scheduler`` or ``--cluster`` (one of them)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--scheduler",
        help="Dask scheduler address (default: DASK_SCHEDULER_ADDRESS, else an embedded LocalCluster)",
    )
    g.add_argument(
        "--cluster",
        metavar="NAME|FILE",
        help="cluster configuration to start or connect to: an installed one by "
        "name (local, processes, ssh, slurm, pbs, kubernetes; `dplr cluster "
        "list`) or a file of your own (kinds local, scheduler, ssh, slurm, pbs, "
        "or a Kubernetes DaskCluster)",
    )


def cluster_of(args: argparse.Namespace) -> Any:
    """The validated --cluster file or installed name, or None: checked before
    anything starts."""
    if args.cluster is None:
        return None
    # heavy: zarr, kept off the import path of `dplr --help`
    from pipeline.jobs.clusters import load_cluster_config

    return load_cluster_config(args.cluster)


def unless_locked(
    handler: Callable[[argparse.Namespace], int], args: argparse.Namespace
) -> int:
    """``handler(args)``, or exit code 75 (retry later) when another run holds the
    stream's lock; any other error propagates to main()."""
    # from jobs.stream, which every locked verb imports anyway, not jobs.data: that
    # one also imports dask.array (0.25 s on every ingest)
    # heavy: zarr, scipy, behind pipeline.io: kept off the import path of ``dplr --help``
    from pipeline.jobs.stream import StateLockedError

    try:
        return handler(args)
    except StateLockedError as exc:
        print(f"dplr: busy: {redact(str(exc))}", file=sys.stderr)
        return EXIT_LOCKED


def budget_of(args: argparse.Namespace) -> tuple[float, float] | None:
    """The lifetime budget of ``--budget-epsilon``/``--budget-delta`` (both or neither)."""
    if args.budget_epsilon is None and args.budget_delta is None:
        return None
    if args.budget_epsilon is None or args.budget_delta is None:
        raise InvalidParameterError("--budget-epsilon and --budget-delta go together.")
    return args.budget_epsilon, args.budget_delta


def ledger_lines(report: dict[str, Any]) -> list[str]:
    """The summary's lines about where a release was charged and what the budget has left."""
    led = report.get("ledger")
    if not led:
        return []
    if led.get("kind") == "in-process":
        return [
            (
                f"  charged to this process's accountant (no ledger file): {led['n_releases']} "
                f"release(s) compose to epsilon={led['epsilon_used']:.4g} at "
                f"delta={led['delta_used']:.3g}"
            )
        ]
    return [
        (
            f"  ledger: {led['path']}  lifetime budget (epsilon={led['budget_epsilon']:g}, "
            f"delta={led['budget_delta']:g}) for one {led['unit']} under {led['neighboring']} "
            f"neighbours; {led['n_releases']} release(s) compose to "
            f"epsilon={led['epsilon_used']:.4g} at the budget's delta"
        )
    ]


def signal_lines(report: dict[str, Any]) -> list[str]:
    """The summary's line on the components above the noise (none without noise)."""
    sig = report.get("signal")
    if not sig:
        return []
    return [
        (
            f"  {sig['above']} of {sig['of']} components above the noise (level "
            f"{sig['noise_level']:.4g} at {sig['confidence']:.0%})"
        )
    ]


def warn_signal(report: dict[str, Any]) -> None:
    """One line on stderr when none or few released components stand above the noise."""
    sig = report.get("signal")
    if sig and sig["advice"]:
        print(f"dplr: warning: {sig['advice']}", file=sys.stderr)


def time_field(report: dict[str, Any]) -> str:
    """`` time=1.23s`` from the report's total time, or nothing when the report
    has none (a private selection withholds it: it would reveal its trials)."""
    total = report.get("timings_seconds", {}).get("total")
    return "" if total is None else f" time={total:.2f}s"


def factorize_summary(report: dict[str, Any], out: str) -> str:
    """The human summary of a factorization's report (``dplr factorize``
    without ``--json``, and ``dplr demo``)."""
    lines = [f"released rank-{report['rank']} factorization to {redact(out)}"]
    if report.get("epsilon") is None:
        lines.append("  NOT PRIVATE: non-private run (no clipping, no noise)")
    else:
        lines.append(
            f"  privacy: ({report['epsilon']:g}, {report['delta']:g})-DP, unit={report['privacy_unit']}, "
            f"neighboring={report['neighboring']}, clip norm={report['clip_norm']:g}"
        )
        for s in report["sketches"]:
            lines.append(
                f"  sketch {s['name']:<3} shape={tuple(s['shape'])} sensitivity={s['sensitivity']:.4g} sigma={s['sigma']:.4g}"
            )
        lines.extend(ledger_lines(report))
        if not report["private"]:
            lines.append("  NOT PRIVATE: noise drawn from --insecure-noise-seed")
        lines.extend(signal_lines(report))
    p = report["parameters"]
    lines.append(
        f"  algorithm={report['algorithm']} t={p['sketch_size']} v={p['core_size']} passes={report['n_passes']}"
        + time_field(report)
    )
    if report.get("resumed_from_journal"):
        lines.append(
            "  resumed from the journal of an interrupted run (same noise, no new charge)"
        )
    return "\n".join(lines)


def options_of(args: argparse.Namespace) -> Any:
    """Where a release of ``dplr factorize`` or ``dplr pca`` goes and is charged."""

    return ReleaseOptions(
        out=args.out, overwrite=args.overwrite, ledger=args.ledger,
        budget=budget_of(args), journal=args.journal,
        scratch=getattr(args, "scratch", None),
        insecure_noise_seed=args.insecure_noise_seed,
    )  # fmt: skip


def runtime_of(args: argparse.Namespace) -> Any:
    """Where a release runs: the scheduler or cluster file, the flags of the
    ``runtime`` section (``--cache``); progress on stderr unless ``--quiet``."""

    return Runtime(
        scheduler=args.scheduler, cluster_config=cluster_of(args),
        progress=None if args.quiet else sys.stderr,
        **params_kwargs(Runtime, args),
    )  # fmt: skip

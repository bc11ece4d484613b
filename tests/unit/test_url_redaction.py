"""URLs and endpoints as dplr prints and records them.

``redact`` replaces the user-info of every URL in a text (``user:password@``)
by ``***@`` and leaves everything else as it was; ``location`` keeps a URL a
URL (``os.path`` once turned ``s3://data/a.zarr`` into ``<cwd>/s3:/data/a.zarr``)
and makes a local path absolute.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import InvalidParameterError
from pipeline.io.objectstore import local_path, location, redact

SECRETS = ("KEY", "SECRET")

REDACTED = {
    # text -> the same text redacted
    "http://KEY:SECRET@host:9": "http://***@host:9",
    "https://KEY:SECRET@minio.local:9000/": "https://***@minio.local:9000/",
    "s3://KEY:SECRET@bucket/a.zarr": "s3://***@bucket/a.zarr",
    "http://KEY@host:9": "http://***@host:9",  # a token alone
    # percent-encoded specials, as RFC 3986 wants them
    "http://KEY:SE%40C%2FR%3AET%23@host:9/p": "http://***@host:9/p",
    # raw sub-delimiters, ":" and "@" in the password
    "http://KEY:S!$&'()*+,;=E:C@R@ET@host:9": "http://***@host:9",
    # raw "/", "?" and "#" in the password: everything up to the last "@"
    "http://KEY:SE/C?R#ET@host:9/x": "http://***@host:9/x",
    # inside messages, quoted, several per text, across lines
    "the object store at http://KEY:SECRET@h:9 cannot be reached": (
        "the object store at http://***@h:9 cannot be reached"
    ),
    "input store 's3://KEY:SECRET@b/a.zarr': at \"https://KEY:SECRET@h\"\nnext http://KEY@h": (
        "input store 's3://***@b/a.zarr': at \"https://***@h\"\nnext http://***@h"
    ),
    # a quote inside the password (repr then quotes with ")
    "at \"http://KEY:SE'CRET@h:9\"": "at \"http://***@h:9\"",
}

UNCHANGED = [
    "",
    "AWS S3",
    "http://127.0.0.1:9",
    "https://s3.eu-west-1.amazonaws.com/",
    "s3://data/a.zarr",
    "s3://bucket/dir/a@b.zarr",  # an "@" in a key is no user-info
    "/local/path@x/a.zarr",
    "user@host:/path",  # no scheme: not a URL
    "the input 's3://data/a.zarr' does not exist at http://127.0.0.1:9.",
]


@pytest.mark.parametrize("text", list(REDACTED))
def test_user_info_is_redacted(text: str) -> None:
    shown = redact(text)
    assert shown == REDACTED[text]
    for word in SECRETS:
        assert word not in shown
    assert redact(shown) == shown  # idempotent


@pytest.mark.parametrize("text", UNCHANGED)
def test_text_without_user_info_is_unchanged(text: str) -> None:
    assert redact(text) == text


def test_location_keeps_urls_and_makes_paths_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert location("s3://data/a.zarr") == "s3://data/a.zarr"
    assert location("s3://data/a.zarr/") == "s3://data/a.zarr"
    assert location("a.zarr") == str(tmp_path / "a.zarr")
    assert location(Path("x") / "a.zarr") == str(tmp_path / "x" / "a.zarr")
    # the negative control: what os.path made of the URL
    assert os.path.abspath("s3://data/a.zarr") == str(tmp_path / "s3:" / "data" / "a.zarr")


def test_unsupported_schemes_and_urls_for_local_paths_are_refused() -> None:
    with pytest.raises(InvalidParameterError, match="only s3:// object storage") as info:
        location("gs://KEY:SECRET@bucket/a.zarr")
    assert "SECRET" not in str(info.value)
    with pytest.raises(InvalidParameterError, match="the ledger must be on a local") as info:
        local_path("s3://KEY:SECRET@bucket/l.json", "ledger", "--ledger")
    assert "SECRET" not in str(info.value)
    assert "--ledger PATH" in str(info.value)


@pytest.mark.parametrize(
    ("error", "code"),
    [(InvalidParameterError, 2), (RuntimeError, 1)],  # a one-line error; a traceback
)
def test_the_cli_prints_no_user_info_on_any_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: type, code: int
) -> None:
    from pipeline import cli
    from pipeline.cli import budget as cli_budget

    def fail(args: object) -> int:
        raise error("the object store at http://KEY:SECRET@127.0.0.1:9 cannot be reached")

    monkeypatch.setattr(cli_budget, "run", fail)
    assert cli.main(["budget", "show", "a.zarr"]) == code
    err = capsys.readouterr().err
    assert "http://***@127.0.0.1:9" in err  # the message itself was printed
    assert "KEY" not in err
    assert "SECRET" not in err
    if code == 1:
        assert "Traceback" in err


def test_budget_init_of_an_s3_dataset_needs_its_ledger_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No request is made: the refusal comes first. The directory that
    ``<cwd>/s3:/data/a.zarr`` names exists, so a URL read as a path would have
    put a ledger there (the old behaviour)."""
    from pipeline import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:" / "data").mkdir(parents=True)
    argv = ["budget", "init", "s3://data/a.zarr", "--epsilon", "1", "--delta", "1e-6"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "object storage" in err[0]
    assert "--ledger" in err[0]
    assert [p.name for p in tmp_path.rglob("*")] == ["s3:", "data"]
    assert cli.main([*argv, "--ledger", "l.json"]) == 0  # with its ledger named
    assert (tmp_path / "l.json").is_file()

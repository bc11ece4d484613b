"""A ``dplr-ledger/1`` file holding a stream's charge is read at the stream's unit.

Before contracts, ``stream init`` charged the whole stream once to a ledger,
with ``algorithm = "continual-<algorithm>"`` and ``details["stream"]`` naming
the state. That record is a release about one *entity* of the stream (its
updates may touch any row, column or cell, and several entities may share a
row), so it bounds nothing about one row: reading it as a row release, as the
contract-less reading of an old record does, lets matrix releases compose with
it as if the stream had protected rows.

``V1_STREAM`` and ``V1_MATRIX`` are records exactly as dplr wrote them before
contracts (``stream_init(..., ledger=PATH, budget=(4.0, 1e-5))`` on a 40 x 12
stream of horizon 4 at (epsilon, delta) = (1, 1e-6), add/remove, followed by
``factorize(A, 2, epsilon=1.0, delta=1e-6, ledger=PATH)`` on a 40 x 12 matrix),
with the state path replaced.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from pipeline.accounting.ledger import Ledger
from pipeline.errors import PrivacyConfigError, StoreLayoutError

V1_STREAM = {
    "release_id": "stream-cdd1b13abf5741558988feb0685f6cc7",
    "time": "2026-12-06T02:01:04.616651+00:00",
    "algorithm": "continual-spectral",
    "epsilon": 1.0,
    "delta": 1e-06,
    "delta_jl": 5e-07,
    "noise_multiplier_total": 4.365154941135753,
    "details": {
        "stream": "/srv/streams/s.stream",
        "horizon": 4,
        "tree_levels": 3,
        "rank": 2,
        "sketch_size": 12,
        "core_size": 40,
        "noise_reproducible_not_private": False,
    },
}
V1_MATRIX = {
    "release_id": "16a81a9427de4263ae7b5c465ffedeb6",
    "time": "2026-12-06T02:01:05.019039+00:00",
    "algorithm": "spectral",
    "epsilon": 1.0,
    "delta": 1e-06,
    "delta_jl": 5e-07,
    "noise_multiplier_total": 4.365154941135754,
    "details": {
        "rank": 2,
        "sketch_size": 12,
        "core_size": 40,
        "output": None,
        "noise_reproducible_not_private": False,
    },
}


def _v1(path: pathlib.Path, records: list[dict[str, object]]) -> pathlib.Path:
    """A ``dplr-ledger/1`` file as ``Ledger.create`` + ``charge`` wrote it then."""
    data = {
        "format": "dplr-ledger/1",
        "dataset": "s.stream",
        "budget": {"epsilon": 4.0, "delta": 1e-05},
        "releases": records,
    }
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


@pytest.fixture
def path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "pop.dplr-ledger.json"


def test_a_v1_stream_record_is_read_as_an_entity_release(path: pathlib.Path) -> None:
    _v1(path, [V1_STREAM])
    summary = Ledger.open(path).remaining_summary()
    assert (summary["unit"], summary["neighboring"], summary["contract_assumed"]) == (
        "entity",
        "replace",
        True,
    )
    # The record does not say the stream's relation: read as add/remove under
    # replace, mu counts twice (group privacy of size 2), as for matrix records.
    assert summary["noise_multiplier_total"] == 4.365154941135753 / 2

    # A matrix release composes with rows, about which the stream says nothing:
    # refused, and nothing is written.
    before = path.read_bytes()
    A = np.random.default_rng(0).normal(size=(40, 12)) / 10
    from pipeline.api import factorize

    with pytest.raises(PrivacyConfigError, match=r"unit 'entity'.*unit 'row'"):
        factorize(A, 2, epsilon=0.5, delta=1e-7, insecure_noise_seed=1, ledger=path)
    assert path.read_bytes() == before


def test_a_new_stream_composes_with_the_v1_stream_of_its_population(
    path: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    from pipeline.jobs.stream import stream_init

    _v1(path, [V1_STREAM])
    stream_init(
        tmp_path / "t.stream", n_rows=40, n_cols=12, rank=2, horizon=4,
        epsilon=1.0, delta=1e-6, ledger=path,
    )  # fmt: skip
    led = Ledger.open(path)
    new = led.releases[-1]
    assert new["contract"]["unit"] == "entity"
    # both add/remove entity releases, each read under replace as 2 mu
    z_new = float(new["noise_multiplier_total"])
    expected = ((4.365154941135753 / 2) ** -2 + (z_new / 2) ** -2) ** -0.5
    np.testing.assert_allclose(
        led.remaining_summary()["noise_multiplier_total"], expected, rtol=1e-12
    )
    data = json.loads(path.read_text())
    assert data["contract"] == {
        "unit": "entity",
        "neighboring": "replace",
        "assumed_for": "dplr-ledger/1",
    }
    assert data["releases"][0] == V1_STREAM  # unchanged, still without contract


def test_a_v1_ledger_mixing_a_stream_and_a_matrix_release_is_refused(
    path: pathlib.Path,
) -> None:
    # No unit bounds both an entity's and a row's effect: no reading is exact.
    _v1(path, [V1_STREAM, V1_MATRIX])
    with pytest.raises(StoreLayoutError, match=r"releases\[1\].*unit 'row'.*'entity'"):
        Ledger.open(path)
    # The same stream record in a file that declares rows (a row-level ledger
    # rewritten from an old file) is refused too.
    data = {
        "format": "dplr-ledger/2",
        "dataset": "s.stream",
        "budget": {"epsilon": 4.0, "delta": 1e-05},
        "contract": {
            "unit": "row",
            "neighboring": "replace",
            "assumed_for": "dplr-ledger/1",
        },
        "releases": [V1_MATRIX, V1_STREAM],
    }
    path.write_text(json.dumps(data))
    with pytest.raises(StoreLayoutError, match=r"releases\[1\].*unit 'entity'.*'row'"):
        Ledger.open(path)


def test_control_a_v1_matrix_record_is_still_read_as_a_row_release(
    path: pathlib.Path,
) -> None:
    _v1(path, [V1_MATRIX])
    summary = Ledger.open(path).remaining_summary()
    assert (summary["unit"], summary["neighboring"]) == ("row", "replace")
    assert summary["noise_multiplier_total"] == 4.365154941135754 / 2

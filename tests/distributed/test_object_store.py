"""Zarr stores in S3-compatible object storage.

A real S3 server process (``moto`` in server mode) runs on loopback for the
module, with credentials enforced: an IAM user's key is made while the server
still accepts anonymous requests, then authentication is switched on
(``/moto-api/reset-auth``). The cluster's workers are started after the
environment holds the endpoint and the key, so they read the store themselves.

* ``dplr factorize s3://...`` and ``dplr pca s3://...`` (and a release written
  to ``s3://``) give the same arrays, bit for bit, as the same commands on a
  local copy of the store, with the same seeds;
* a missing bucket, wrong credentials and an unreachable endpoint end the
  command with exit code 2 and one line on stderr, before anything is charged
  (the ledger file is byte-identical);
* an ``s3://`` ledger or journal is refused in one line (they need atomic writes);
* an ``s3://`` input has no default ledger: without ``--ledger`` it is refused in
  one line with nothing written anywhere, and releases from two working
  directories compose in the one ``--ledger`` they name;
* an endpoint URL carrying credentials (``http://KEY:SECRET@host``) is printed
  with ``***`` for them, and they are written nowhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from dist_util import seeded_matrix, start_cluster, write_matrix
from distributed import LocalCluster

from pipeline.accounting.ledger import Ledger
from pipeline.errors import StoreLayoutError
from pipeline.io import read_group, read_release

pytestmark = pytest.mark.distributed

M, N, RANK = 300, 20, 3
CHUNKS = (40, N)
SEEDS = ("--seed", "11", "--insecure-noise-seed", "5")
PRIVACY = ("--epsilon", "1", "--delta", "1e-6")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, timeout: float = 60.0) -> None:
    t0 = time.monotonic()
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return
        except OSError:
            if time.monotonic() - t0 > timeout:
                raise
            time.sleep(0.2)


def _make_key(endpoint: str) -> tuple[str, str]:
    """An IAM user allowed everything, and its access key (anonymous phase)."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id="setup", aws_secret_access_key="setup")  # fmt: skip
    iam.create_user(UserName="dplr")
    iam.put_user_policy(
        UserName="dplr", PolicyName="all",
        PolicyDocument='{"Version": "2012-10-17", "Statement": '
        '[{"Effect": "Allow", "Action": "*", "Resource": "*"}]}',
    )  # fmt: skip
    key = iam.create_access_key(UserName="dplr")["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    """The server process; yields the environment that reaches it."""
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    saved = dict(os.environ)
    try:
        _wait_port(port)
        key, secret = _make_key(endpoint)
        req = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST",
                                     headers={"Content-Type": "text/plain"})  # fmt: skip
        urllib.request.urlopen(req, timeout=10).close()
        env = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret,
               "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"}  # fmt: skip
        for stale in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN",
                      "DPLR_STORAGE_OPTIONS"):  # fmt: skip
            os.environ.pop(stale, None)
        os.environ.update(env)
        yield env
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def cluster(s3: dict[str, str]) -> Iterator[LocalCluster]:
    # started after the environment holds the endpoint and key: the workers inherit them
    with start_cluster(2) as c:
        yield c


@pytest.fixture(scope="module")
def stores(s3: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The same matrix as a local store and, uploaded, as ``s3://data/a.zarr``."""
    from pipeline.io.objectstore import filesystem

    tmp = tmp_path_factory.mktemp("stores")
    local = write_matrix(tmp / "a.zarr", seeded_matrix(2, M, N), CHUNKS)
    import boto3

    client = boto3.client("s3", endpoint_url=s3["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=s3["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=s3["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    for bucket in ("data", "out"):
        client.create_bucket(Bucket=bucket)
    filesystem().put(local, "data/a.zarr", recursive=True)
    return {"local": local, "s3": "s3://data/a.zarr"}


def _dplr(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **env}
    full.pop("DASK_SCHEDULER_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args], capture_output=True, text=True,
        timeout=300, env=full, check=False, cwd=cwd,
    )  # fmt: skip


def _assert_same_arrays(a, b, names: tuple[str, ...]) -> None:
    for n in names:
        np.testing.assert_array_equal(np.asarray(getattr(a, n)), np.asarray(getattr(b, n)), err_msg=n)


def test_factorize_from_s3_equals_the_local_store(s3, cluster, stores, tmp_path: Path) -> None:
    common = ("--rank", str(RANK), *PRIVACY, *SEEDS, "--scheduler", cluster.scheduler_address,
              "--budget-epsilon", "10", "--budget-delta", "1e-4", "--quiet")  # fmt: skip
    local = _dplr(s3, "factorize", stores["local"], "--out", str(tmp_path / "local.zarr"),
                  "--ledger", str(tmp_path / "l1.json"), *common)  # fmt: skip
    assert local.returncode == 0, local.stderr
    remote = _dplr(s3, "factorize", stores["s3"], "--out", "s3://out/lrf.zarr",
                   "--ledger", str(tmp_path / "l2.json"), *common)  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    a, b = read_release(tmp_path / "local.zarr"), read_release("s3://out/lrf.zarr")
    _assert_same_arrays(a, b, ("U", "S", "V"))
    assert b.report["input"]["path"] == stores["s3"]
    # the release in object storage holds its report: it was published
    assert read_group("s3://out/lrf.zarr", ())[1]["release_id"] == b.report["release_id"]


def test_pca_from_s3_equals_the_local_store(s3, cluster, stores, tmp_path: Path) -> None:
    common = ("--rank", str(RANK), *PRIVACY, "--insecure-noise-seed", "5",
              "--method", "analyze-gauss", "--scheduler", cluster.scheduler_address,
              "--budget-epsilon", "10", "--budget-delta", "1e-4", "--quiet")  # fmt: skip
    local = _dplr(s3, "pca", stores["local"], "--out", str(tmp_path / "pca.zarr"),
                  "--ledger", str(tmp_path / "p1.json"), *common)  # fmt: skip
    assert local.returncode == 0, local.stderr
    remote = _dplr(s3, "pca", stores["s3"], "--out", str(tmp_path / "pca-s3.zarr"),
                   "--ledger", str(tmp_path / "p2.json"), *common)  # fmt: skip
    assert remote.returncode == 0, remote.stderr
    names = ("components", "eigenvalues")
    (a, _), (b, _) = read_group(tmp_path / "pca.zarr", names), read_group(tmp_path / "pca-s3.zarr", names)
    for n in names:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


FAILURES = {
    # name -> (input, output, environment changes, words of the one line)
    "missing bucket": ("s3://nobucket/a.zarr", None, {}, "does not exist"),
    "missing output bucket": (None, "s3://nobucket/r.zarr", {}, "does not exist"),
    "wrong credentials": ("s3://data/a.zarr", None,
                          {"AWS_SECRET_ACCESS_KEY": "not-the-secret"}, "access denied"),
    "unreachable endpoint": ("s3://data/a.zarr", None,
                             {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}"},
                             "cannot be reached"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_object_store_failures_are_one_line_and_charge_nothing(
    s3, cluster, stores, tmp_path: Path, case: str
) -> None:
    source, out, env, words = FAILURES[case]
    ledger = tmp_path / "ledger.json"
    Ledger.create(ledger, dataset="a.zarr", epsilon=10.0, delta=1e-4)
    before = _digest(ledger)
    res = _dplr({**s3, **env}, "factorize", source or stores["local"],
                "--out", out or str(tmp_path / "r.zarr"), "--rank", str(RANK), *PRIVACY,
                "--ledger", str(ledger), "--scheduler", cluster.scheduler_address, "--quiet")  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert words in lines[0]
    assert s3["AWS_SECRET_ACCESS_KEY"] not in res.stderr + res.stdout
    assert _digest(ledger) == before  # nothing charged
    assert not (tmp_path / "r.zarr").exists()


@pytest.mark.parametrize(
    ("flag", "what"), [("--ledger", "ledger"), ("--journal", "journal"), (None, "ledger")]
)
def test_s3_ledger_or_journal_is_refused(s3, cluster, stores, tmp_path: Path, flag, what) -> None:
    extra = () if flag is None else (flag, "s3://out/state")
    if flag != "--ledger":
        extra = (*extra, "--budget-epsilon", "10", "--budget-delta", "1e-4")
        if flag is not None:
            extra = (*extra, "--ledger", str(tmp_path / "l.json"))
    res = _dplr(s3, "factorize", stores["s3"], "--out", str(tmp_path / "r.zarr"),
                "--rank", str(RANK), *PRIVACY, *extra, "--scheduler", cluster.scheduler_address)  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"the {what}" in lines[0] or "ledger cannot live" in lines[0]
    assert not (tmp_path / "l.json").exists()


def test_s3_stream_state_and_stream_release_are_refused(tmp_path: Path) -> None:
    """A stream state (manifest commits, a lock, private secrets) and a stream
    release (recorded by a rename) need a filesystem: refused before any request."""
    from pipeline.errors import InvalidParameterError
    from pipeline.io.stream_state import StreamStore
    from pipeline.jobs.stream import stream_release

    with pytest.raises(InvalidParameterError, match="the stream state must be on a local"):
        StreamStore.open("s3://data/state")
    with pytest.raises(InvalidParameterError, match="the stream state must be on a local"):
        StreamStore.create("s3://data/state", manifest={}, sketch_seed=1, noise_key=None)
    with pytest.raises(InvalidParameterError, match="the stream release must be on a local"):
        stream_release(tmp_path / "state", epoch=1, out="s3://out/r.zarr")
    assert list(tmp_path.iterdir()) == []  # nothing made locally (no "s3:" directory)


def _objects() -> dict[str, str | None]:
    """Every object in the server's buckets, with its ETag (what a run could have written)."""
    from pipeline.io.objectstore import filesystem

    fs = filesystem()
    return {
        name: info.get("ETag")
        for bucket in fs.ls("", detail=False)
        for name, info in fs.find(bucket, detail=True).items()
    }


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_one_ledger_holds_across_working_directories(s3, cluster, stores, tmp_path: Path) -> None:
    """Two releases of one ``s3://`` input, run from two working directories,
    charge one ``--ledger``; the budget fits one release of (1, 1e-6) but not two
    (together epsilon 1.28 at delta 1e-5), so the second is refused, and the input
    is recorded as its URL (once it was ``<cwd>/s3:/data/a.zarr``)."""
    ledger = tmp_path / "shared" / "a.dplr-ledger.json"
    ledger.parent.mkdir()

    def release(i: int, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        (tmp_path / f"wd{i}").mkdir(exist_ok=True)
        return _dplr(
            env, "factorize", stores["s3"], "--out", f"r{i}.zarr", "--ledger", str(ledger),
            "--rank", str(RANK), *PRIVACY, "--budget-epsilon", "1", "--budget-delta", "1e-5",
            "--scheduler", cluster.scheduler_address, "--quiet", cwd=tmp_path / f"wd{i}",
        )  # fmt: skip

    # killed after its journal was written: the journal's header names the input
    killed = release(1, {**s3, "DPLR_CRASH_AT": "after-journal"})
    assert killed.returncode == -9, killed.stderr
    header = json.loads((tmp_path / "wd1" / ".r1.zarr.dplr-journal" / "header.json").read_text())
    assert header["job"]["input"] == stores["s3"]
    assert header["job"]["ledger"] == str(ledger)
    first, second = release(1, s3), release(2, s3)  # the rerun resumes and publishes
    assert first.returncode == 0, first.stderr
    assert second.returncode == 3, second.stderr  # refused: the budget is spent
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert "dplr: refused" in second.stderr
    assert len(Ledger.open(ledger).releases) == 1
    assert Ledger.open(ledger).dataset == "a.zarr"
    report = read_release(tmp_path / "wd1" / "r1.zarr").report
    assert report["input"]["path"] == stores["s3"]
    assert report["ledger"]["path"] == str(ledger)
    assert os.listdir(tmp_path / "wd1") == ["r1.zarr"]  # the release, nothing else
    assert os.listdir(tmp_path / "wd2") == []


@pytest.mark.parametrize("out", ["local", "s3"])
def test_s3_input_without_ledger_is_refused_and_writes_nothing(
    s3, cluster, stores, tmp_path: Path, out: str
) -> None:
    """No default ledger for an ``s3://`` input: exit 2, one line naming
    ``--ledger``, nothing written in the working directory, the buckets or the
    output -- even where the directory that ``<cwd>/s3:/data/a.zarr`` would name
    exists (the old code made its ledger there)."""
    wd = tmp_path / "wd"
    (wd / "s3:" / "data").mkdir(parents=True)
    (tmp_path / "outdir").mkdir()
    target = str(tmp_path / "outdir" / "r.zarr") if out == "local" else "s3://out/nl.zarr"
    before = _objects()
    res = _dplr(s3, "factorize", stores["s3"], "--out", target, "--rank", str(RANK), *PRIVACY,
                "--budget-epsilon", "10", "--budget-delta", "1e-4",
                "--scheduler", cluster.scheduler_address, "--quiet", cwd=wd)  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "object storage" in lines[0]
    assert "--ledger" in lines[0]
    assert _files(wd) == ["s3:", "s3:/data"]  # nothing beside what the test made
    assert _files(tmp_path / "outdir") == []
    assert _objects() == before


PLANTED_KEY, PLANTED_SECRET = "AKIAPLANTEDKEY7", "pl4nted/Secret+x"


@pytest.mark.parametrize("source", ["AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "DPLR_STORAGE_OPTIONS"])
def test_credentials_in_an_endpoint_url_are_never_printed_or_written(
    s3, cluster, stores, tmp_path: Path, source: str
) -> None:
    """An endpoint with user-info (``http://KEY:SECRET@host:port``), unreachable:
    exit 2, one line naming the endpoint's host and port (so the planted
    endpoint was the one used) with ``***`` for its user-info; neither the key nor
    the secret on stderr, stdout, in the ledger or anywhere under the run's
    directories."""
    from urllib.parse import quote

    port = _free_port()
    endpoint = f"http://{PLANTED_KEY}:{quote(PLANTED_SECRET, safe='')}@127.0.0.1:{port}"
    env = dict(s3)
    if source == "DPLR_STORAGE_OPTIONS":
        opts = tmp_path / "opts.json"
        opts.write_text(json.dumps({"endpoint_url": endpoint}))
        env[source] = str(opts)
    else:
        env[source] = endpoint
    ledger = tmp_path / "ledger.json"
    Ledger.create(ledger, dataset="a.zarr", epsilon=10.0, delta=1e-4)
    before = _digest(ledger)
    (tmp_path / "wd").mkdir()
    res = _dplr(env, "factorize", stores["s3"], "--out", str(tmp_path / "r.zarr"),
                "--rank", str(RANK), *PRIVACY, "--ledger", str(ledger),
                "--scheduler", cluster.scheduler_address, "--quiet", cwd=tmp_path / "wd")  # fmt: skip
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert f"http://***@127.0.0.1:{port}" in lines[0]  # the planted endpoint was used
    assert "cannot be reached" in lines[0]
    # everything the run could have written (the options file holds the endpoint by design)
    written = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p.name != "opts.json"]
    for word in (PLANTED_KEY, PLANTED_SECRET, quote(PLANTED_SECRET, safe="")):
        assert word not in res.stderr + res.stdout
        assert not any(word.encode() in blob for blob in written)
    assert _digest(ledger) == before
    assert not (tmp_path / "r.zarr").exists()
    assert os.listdir(tmp_path / "wd") == []



def test_csr_store_from_s3_equals_the_local_store(s3, stores, tmp_path: Path) -> None:
    """A CSR group in AnnData's layout (ours, v3; AnnData's, v2) opens and reads
    from ``s3://`` through the same path as a dense input, band for band."""
    import anndata
    import scipy.sparse as sp

    from pipeline.io.csr import open_csr, write_csr
    from pipeline.io.objectstore import filesystem

    x = sp.random(41, 13, density=0.3, format="csr", rng=np.random.default_rng(3))
    write_csr(tmp_path / "c.zarr", x, chunk_nnz=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # anndata's notice about its v2 default
        anndata.AnnData(x).write_zarr(tmp_path / "ad.zarr")
    for name in ("c.zarr", "ad.zarr"):
        filesystem().put(str(tmp_path / name), f"data/{name}", recursive=True)
        local, remote = open_csr(tmp_path / name), open_csr(f"s3://data/{name}")
        assert remote.shape == local.shape == x.shape
        for r0, r1 in ((0, 7), (7, 7), (7, 41)):
            a, b = remote.band(r0, r1), local.band(r0, r1)
            np.testing.assert_array_equal(a.indptr, b.indptr)
            np.testing.assert_array_equal(a.indices, b.indices)
            np.testing.assert_array_equal(a.data, b.data)
    with pytest.raises(StoreLayoutError, match="does not exist"):
        open_csr("s3://data/missing.zarr")

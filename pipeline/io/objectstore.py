"""Zarr stores in S3-compatible object storage (``s3://bucket/key.zarr``).

Problem. On Kubernetes and in the cloud the inputs and the releases live in
object storage, which every worker reads directly. A URL is
opened as zarr's :class:`~zarr.storage.FsspecStore` over ``s3fs``; the
connection comes from the usual environment -- ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN``), ``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, ``AWS_REGION`` -- or from a JSON file of ``s3fs`` storage
options named by ``DPLR_STORAGE_OPTIONS``; never from the command line. No
credential is ever put in a message or a report.

Object storage has no atomic rename, so what needs one stays on a local or
shared filesystem: the privacy ledger, the release journals, the scratch
directory and the stream states (:func:`refuse_url`). A release written to a URL is published by its
last write, the root group's metadata carrying the report (one PUT, atomic):
until then a reader finds no report and refuses it as incomplete.
"""

from __future__ import annotations

import json
import os
from typing import Any

from pipeline.errors import InvalidParameterError, StoreLayoutError

__all__ = [
    "filesystem",
    "is_url",
    "open_store",
    "refuse_url",
    "storage_options",
    "url_exists",
    "url_fingerprint",
]

SCHEMES = ("s3://",)

#: Seconds to wait for a connection, and attempts, before an endpoint is called
#: unreachable (botocore's defaults wait 60 s per attempt, several times).
CONNECT_TIMEOUT = 5
MAX_ATTEMPTS = 2


def is_url(path: Any) -> bool:
    """True for an object-store URL (``s3://...``)."""
    return isinstance(path, str) and path.startswith(SCHEMES)


def refuse_url(path: Any, what: str, flag: str | None = None) -> None:
    """Refuse an object-store URL where a local or shared path is needed."""
    if is_url(path):
        how = f"pass {flag} PATH" if flag else "use a local or shared path"
        raise InvalidParameterError(
            f"the {what} must be on a local or shared filesystem, not {path!r}: it "
            f"needs atomic writes, which object storage lacks; {how}."
        )


def storage_options() -> dict[str, Any]:
    """``s3fs`` options from ``DPLR_STORAGE_OPTIONS`` (a JSON file) and the
    environment's endpoint and region (credentials are read by botocore)."""
    opts: dict[str, Any] = {}
    path = os.environ.get("DPLR_STORAGE_OPTIONS")
    if path:
        try:
            with open(path) as fh:
                opts = json.load(fh)
        except (OSError, ValueError) as exc:
            raise InvalidParameterError(
                f"the storage-options file DPLR_STORAGE_OPTIONS={path!r} cannot be read "
                f"as JSON ({type(exc).__name__}); fix or unset it."
            ) from None
        if not isinstance(opts, dict):
            raise InvalidParameterError(
                f"the storage-options file {path!r} must hold a JSON object."
            )
    client = dict(opts.get("client_kwargs") or {})
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and "endpoint_url" not in opts:
        client.setdefault("endpoint_url", endpoint)
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client.setdefault("region_name", region)
    config = {"connect_timeout": CONNECT_TIMEOUT, "retries": {"max_attempts": MAX_ATTEMPTS}}
    config.update(opts.get("config_kwargs") or {})
    return {**opts, "client_kwargs": client, "config_kwargs": config}


def _endpoint(opts: dict[str, Any]) -> str:
    return str(opts.get("endpoint_url") or opts["client_kwargs"].get("endpoint_url") or "AWS S3")


def filesystem() -> Any:
    """A synchronous ``s3fs.S3FileSystem`` with :func:`storage_options`."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, **storage_options())


def _check_bucket(fs: Any, url: str, what: str, opts: dict[str, Any]) -> None:
    """One request to the bucket: a clear :class:`StoreLayoutError` if it fails."""
    bucket = url.split("://", 1)[1].split("/", 1)[0]
    try:
        fs.info(bucket)
    except FileNotFoundError:
        raise StoreLayoutError(
            f"{what} {url!r}: the bucket {bucket!r} does not exist at {_endpoint(opts)}; "
            "create it or check the URL and AWS_ENDPOINT_URL."
        ) from None
    except PermissionError:
        raise StoreLayoutError(
            f"{what} {url!r}: access denied by {_endpoint(opts)}; check AWS_ACCESS_KEY_ID "
            "and AWS_SECRET_ACCESS_KEY (or the DPLR_STORAGE_OPTIONS file)."
        ) from None
    except Exception as exc:  # noqa: BLE001 - botocore/aiohttp raise many types
        raise StoreLayoutError(
            f"{what} {url!r}: the object store at {_endpoint(opts)} cannot be reached "
            f"({type(exc).__name__}); check AWS_ENDPOINT_URL and the network."
        ) from None


def open_store(url: str, *, read_only: bool, what: str) -> Any:
    """zarr's ``FsspecStore`` for ``url``, after checking that its bucket answers."""
    from zarr.storage import FsspecStore

    opts = storage_options()
    _check_bucket(filesystem(), url, what, opts)
    return FsspecStore.from_url(url, storage_options=opts, read_only=read_only)


def url_exists(url: str, *, what: str) -> bool:
    """True if a Zarr node (``zarr.json``) exists at ``url``."""
    fs = filesystem()
    _check_bucket(fs, url, what, storage_options())
    return bool(fs.exists(f"{url.rstrip('/')}/zarr.json"))


def remove_url(url: str) -> None:
    """Remove every object under ``url`` (an overwritten release)."""
    fs = filesystem()
    if fs.exists(url):
        fs.rm(url, recursive=True)


def url_fingerprint(url: str) -> str:
    """Names, sizes and ETags of the objects under ``url`` (metadata only)."""
    import hashlib

    h = hashlib.sha256()
    found = filesystem().find(url, detail=True)
    for name in sorted(found):
        info = found[name]
        rel = name[len(url.split("://", 1)[1]) :]
        h.update(f"{rel}\0{info.get('size')}\0{info.get('ETag')}\n".encode())
    return h.hexdigest()
